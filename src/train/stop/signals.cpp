#include "train/stop/signals.hpp"

#include <pthread.h>
#include <strings.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <thread>

#include "ckpt/dir_lock.hpp"
#include "ckpt/store.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/signal_safe_text.hpp"
#include "train/stop/final_records.hpp"

namespace hpc::train {
namespace {

std::atomic<int> g_signal{0};     // the first stop request's signal
// When the first SIGTERM was taken (CLOCK_MONOTONIC, ns; 0: none yet): one at least kSameStopNs
// later ends the process at once.
std::atomic<int64_t> g_first_sigterm_ns{0};
// Slurm ends a job (its time limit, scancel) by sending SIGTERM to every task of its steps, and
// to srun in the batch script, which passes its own on to the same tasks: two SIGTERMs a moment
// apart, that mean one stop. Taken for "stop at once", they dropped the checkpoint of every job
// that reached its time limit (seen on the local Slurm cluster). One within this time of the
// first is the same stop; a person's second one comes later.
constexpr int64_t kSameStopNs = 5'000'000'000;
std::atomic<bool> g_requests{false};
std::atomic<bool> g_started{false};
// --stop-signals, as a mask of signal numbers; until use_stop_signals() sets it (g_chosen), the
// candidates taken wait in g_pending.
std::atomic<unsigned> g_stop_mask{0}, g_pending{0};
std::atomic<bool> g_chosen{false};
std::atomic<int> g_final_code{-1};  // outcome_is_final(): the exit code decided, or -1
// What SIGINT's line says would have written a checkpoint: the stop signals chosen (written by
// use_stop_signals before g_chosen is set, read only after it: the handler allocates nothing).
constexpr char kSigintDefault[] =
    ", without a checkpoint: the ones already written are kept (SIGTERM or SIGUSR1 would have written one first)";
char g_sigint_why[192];

constexpr int kChoices[] = {SIGTERM, SIGUSR1, SIGUSR2, SIGHUP};
constexpr int kSignals[] = {SIGTERM, SIGUSR1, SIGUSR2, SIGHUP, SIGINT};

constexpr unsigned bit(int sig) { return 1u << sig; }  // every signal of kSignals is below 32

sigset_t handled_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : kSignals) sigaddset(&set, sig);
  return set;
}

// Async-signal-safe, for say().
const char* name_of(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    default: return "a signal";
  }
}

// One line on stderr from pieces, without allocating: async-signal-safe.
void say(std::initializer_list<const char*> pieces) {
  char line[512];
  size_t n = 0;
  for (const char* p : pieces)
    for (; *p && n < sizeof line - 1; ++p) line[n++] = *p;
  line[n++] = '\n';
  [[maybe_unused]] const ssize_t w = ::write(STDERR_FILENO, line, n);
}

[[noreturn]] void exit_at_once(int sig, const char* why) {
  // A checkpoint being written stays unfinished: its temporary file goes, the checkpoints
  // written before stay (the write replaces nothing until its rename). A heartbeat being
  // replaced is let finish, so that it leaves no heartbeat.tmp.
  ckpt::remove_unfinished_files();
  ckpt::write_final_heartbeat(128 + sig);  // "stopped", not "training"; while the lock is still held
  final_records::write_at_once(name_of(sig), 128 + sig);  // the metrics and Prometheus files say so too
  ckpt::remove_lock_at_exit();
  say({"hpctrain: stopped at once by ", name_of(sig), why});
  ::_exit(128 + sig);
}

// A stop signal left out of --stop-signals: what it would have done unblocked, the process
// ended by it (a checkpoint being written is dropped, as by exit_at_once).
[[noreturn]] void default_action(int sig) {
  ckpt::remove_unfinished_files();
  ckpt::write_final_heartbeat(128 + sig);
  final_records::write_at_once(name_of(sig), 128 + sig);
  ckpt::remove_lock_at_exit();
  say({"hpctrain: ended by ", name_of(sig), " (not in --stop-signals)"});
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, sig);
  pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
  ::raise(sig);  // to this thread, which now lets it through: the default action, termination
  ::_exit(128 + sig);
}

// A signal of kChoices once --stop-signals is known.
void decide(int sig) {
  if (!(g_stop_mask.load() & bit(sig))) default_action(sig);
  if (sig == SIGTERM) {
    timespec t{};
    clock_gettime(CLOCK_MONOTONIC, &t);  // async-signal-safe
    const int64_t now = std::max<int64_t>(int64_t{t.tv_sec} * 1'000'000'000 + t.tv_nsec, 1);
    // One exchange decides which is first: the watcher thread and a handler on a library's thread
    // may take two at the same moment.
    int64_t first = 0;
    if (!g_first_sigterm_ns.compare_exchange_strong(first, now)) {
      if (now - first >= kSameStopNs)
        exit_at_once(sig, " (the second one), without a checkpoint: the ones already written are kept");
      say({"hpctrain: SIGTERM again within 5 s of the first: the same stop (Slurm sends one to each task and srun "
           "passes its own on); a SIGTERM 5 s or more after the first, or SIGINT, stops at once, without a "
           "checkpoint"});
      return;
    }
  }
  int first = 0;
  if (!g_signal.compare_exchange_strong(first, sig))
    say({"hpctrain: ", name_of(sig), ": already stopping (", name_of(first),
         "); a second SIGTERM (5 s or more after the first) or SIGINT would stop at once, without a checkpoint"});
}

// Those taken before --stop-signals was known, each once (whoever empties g_pending decides).
void decide_pending() {
  const unsigned pending = g_pending.exchange(0);
  for (int sig : kChoices)
    if (pending & bit(sig)) decide(sig);
}

// Async-signal-safe (atomics, write, unlink, _exit): also run as a handler.
void take(int sig) {
  if (const int code = g_final_code.load(); code >= 0) ::_exit(code);  // nothing left to save or say
  if (!g_requests.load()) exit_at_once(sig, " (nothing to save)");
  if (sig == SIGINT) exit_at_once(sig, g_chosen.load() ? g_sigint_why : kSigintDefault);
  if (g_chosen.load()) return decide(sig);
  g_pending.fetch_or(bit(sig));
  if (g_chosen.load()) decide_pending();  // chosen meanwhile: use_stop_signals may have missed it
}

extern "C" void on_signal(int sig) {
  const signal_safe::KeepErrno keep;  // across take()'s writes and unlinks
  take(sig);
}

void watch(sigset_t set) {
  for (;;) {
    int sig = 0;
    if (sigwait(&set, &sig) == 0) take(sig);
  }
}

}  // namespace

void block_stop_signals() {
  const sigset_t set = handled_signals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

void start_signal_thread(OnStopSignal mode) {
  if (g_started.exchange(true)) return;
  g_requests = mode == OnStopSignal::Request;
  const sigset_t set = handled_signals();
  // Threads a library started before main() without block_stop_signals() (OpenBLAS's pool) do
  // not block them: a signal that lands there runs the same code as a handler.
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : kSignals) sigaction(sig, &sa, nullptr);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);  // inherited by every thread started from now on
  std::thread(watch, set).detach();
}

std::vector<int> stop_signal_choices() { return {std::begin(kChoices), std::end(kChoices)}; }

std::vector<int> parse_stop_signals(const std::string& list) {
  const std::string choose = " (choose from " + stop_signals_text(stop_signal_choices()) + ")";
  HPC_REQUIRE(!list.empty(), "--stop-signals names no signal", choose);
  std::vector<int> out;
  size_t from = 0;
  for (;;) {
    const size_t comma = list.find(',', from);
    const std::string name = list.substr(from, comma == std::string::npos ? std::string::npos : comma - from);
    const int sig = signal_number_of(name);
    HPC_REQUIRE(!name.empty(), "--stop-signals has an empty name in '", list, "'", choose);
    HPC_REQUIRE(sig != 0, "--stop-signals: unknown signal '", name, "'", choose);
    HPC_REQUIRE(sig != SIGKILL && sig != SIGSTOP, "--stop-signals: ", signal_name(sig),
                " cannot be caught by any program", choose);
    HPC_REQUIRE(sig != SIGINT, "--stop-signals: SIGINT always stops at once, without a checkpoint", choose);
    HPC_REQUIRE(std::count(std::begin(kChoices), std::end(kChoices), sig) == 1, "--stop-signals: ",
                signal_name(sig), " cannot be a stop signal", choose);
    HPC_REQUIRE(std::count(out.begin(), out.end(), sig) == 0, "--stop-signals names ", signal_name(sig), " twice");
    out.push_back(sig);
    if (comma == std::string::npos) return out;
    from = comma + 1;
  }
}

std::string stop_signals_text(const std::vector<int>& signals) {
  std::string text;
  for (int sig : signals) text.append(text.empty() ? "" : ",").append(signal_name(sig).substr(3));
  return text;
}

void use_stop_signals(const std::vector<int>& signals) {
  unsigned mask = 0;
  for (int sig : signals) mask |= bit(sig);
  // The default's two (SIGTERM: Slurm's, scancel's; SIGUSR1: Lightning's) where both stop, else
  // each chosen one: "--stop-signals USR2" is not told that SIGTERM would have checkpointed.
  std::string names;
  if ((mask & bit(SIGTERM)) && (mask & bit(SIGUSR1))) {
    names = "SIGTERM or SIGUSR1";
  } else {
    for (size_t i = 0; i < signals.size(); ++i)
      names += (i == 0 ? "" : i + 1 == signals.size() ? " or " : ", ") + signal_name(signals[i]);
  }
  std::snprintf(g_sigint_why, sizeof g_sigint_why,
                ", without a checkpoint: the ones already written are kept (%s would have written one first)",
                names.c_str());
  g_stop_mask = mask;
  g_chosen = true;
  decide_pending();
}

void end_wait_if_stopped(const std::string& what) {
  int sig = g_signal.load();
  const unsigned pending = g_pending.load();
  for (int choice : kChoices)
    if (sig == 0 && (pending & bit(choice))) sig = choice;
  if (sig == 0) return;
  std::fprintf(stderr, "%shpctrain: stopped at once by %s while waiting for %s: nothing to save yet\n",
               log::stamp(stderr).c_str(), name_of(sig), one_line(what).c_str());
  std::fflush(stderr);
  ::_exit(128 + sig);
}

void outcome_is_final(int exit_code) {
  std::fflush(nullptr);  // _exit() would drop what the streams still buffer
  g_final_code = std::clamp(exit_code, 0, 255);
}

bool StopSignals::requested() { return g_signal.load() != 0; }
int StopSignals::signal_number() { return g_signal.load(); }

void StopSignals::raise_and_wait(int sig) {
  ::kill(::getpid(), sig);  // to the process (raise() would target this thread, which blocks it)
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (!requested() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

std::string signal_name(int sig) {
  const char* abbrev = sig > 0 ? sigabbrev_np(sig) : nullptr;
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

int signal_number_of(const std::string& name) {
  const char* bare = strncasecmp(name.c_str(), "SIG", 3) == 0 ? name.c_str() + 3 : name.c_str();
  for (int sig = 1; sig < NSIG; ++sig)
    if (const char* abbrev = sigabbrev_np(sig); abbrev && *bare && strcasecmp(abbrev, bare) == 0) return sig;
  return 0;
}

}  // namespace hpc::train

#include "train/signals.hpp"

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <thread>

#include "ckpt/store.hpp"

namespace hpc::train {
namespace {

std::atomic<int> g_signal{0};     // the first stop request's signal
std::atomic<int> g_sigterms{0};   // SIGTERMs taken: the second one ends the process at once
std::atomic<bool> g_requests{false};
std::atomic<bool> g_started{false};

constexpr int kSignals[] = {SIGTERM, SIGUSR1, SIGINT};

sigset_t handled_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : kSignals) sigaddset(&set, sig);
  return set;
}

const char* name_of(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
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
  // written before stay (the write replaces nothing until its rename).
  ckpt::remove_unfinished_checkpoint();
  say({"hpctrain: stopped at once by ", name_of(sig), why});
  ::_exit(128 + sig);
}

// Async-signal-safe (atomics, write, unlink, _exit): also run as a handler.
void take(int sig) {
  if (!g_requests.load()) exit_at_once(sig, " (nothing to save)");
  if (sig == SIGINT)
    exit_at_once(sig, ", without a checkpoint: the ones already written are kept (SIGTERM or SIGUSR1 would have "
                      "written one first)");
  if (sig == SIGTERM && g_sigterms.fetch_add(1) > 0)
    exit_at_once(sig, " (the second one), without a checkpoint: the ones already written are kept");
  int first = 0;
  if (!g_signal.compare_exchange_strong(first, sig))
    say({"hpctrain: ", name_of(sig), ": already stopping (", name_of(first),
         "); a second SIGTERM or SIGINT would stop at once, without a checkpoint"});
}

extern "C" void on_signal(int sig) { take(sig); }

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

bool StopSignals::requested() { return g_signal.load() != 0; }
int StopSignals::signal_number() { return g_signal.load(); }

void StopSignals::raise_and_wait(int sig) {
  ::kill(::getpid(), sig);  // to the process (raise() would target this thread, which blocks it)
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (!requested() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

std::string signal_name(int sig) {
  return sig == SIGTERM || sig == SIGUSR1 || sig == SIGINT ? name_of(sig) : "signal " + std::to_string(sig);
}

}  // namespace hpc::train

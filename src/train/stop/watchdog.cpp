#include "train/stop/watchdog.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "core/error.hpp"
#include "core/exit_codes.hpp"
#include "core/log.hpp"
#include "train/stop/final_records.hpp"

namespace hpc::train {
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g s", s);
  return buf;
}

}  // namespace

void StepWatchdog::print_and_exit(const std::string& message) {
  print_expired(message);
  exit_expired();
}

void StepWatchdog::print_expired(const std::string& message) {
  std::fprintf(stderr, "hpctrain: error: %s\n", message.c_str());
  std::fflush(stderr);
}

void StepWatchdog::exit_expired() {
  // evaluate's --metrics-file, made before the set-up that a stopped peer held: no empty file left
  // for a result.
  final_records::remove_made_empty();
  std::fflush(stdout);
  // No destructors, no MPI_Finalize: the main thread is stuck inside a collective and would
  // only hang again. mpirun sees a rank leave with this code and ends the others.
  ::_exit(kExitStepTimeout);
}

namespace {

// After `seconds` (a detached thread: the process ending on its own ends it too), `line` on stderr
// and the process's exit with `exit_code`, whatever still runs. Where no thread can be started
// (the limit of threads or memory that may be why the end is slow), the end as it comes.
void exit_after(double seconds, std::string line, int exit_code) {
  try {
    std::thread([seconds, line = std::move(line), exit_code] {
      std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
      std::fprintf(stderr, "%s\n", line.c_str());
      std::fflush(nullptr);
      ::_exit(exit_code);
    }).detach();
  } catch (const std::exception&) {
  }
}

}  // namespace

void bound_the_end(double timeout_seconds, const std::string& where, int exit_code, bool peers) {
  if (timeout_seconds <= 0) return;
  exit_after(timeout_seconds,
             detail::concat("hpctrain: error: ", where, ": the run ended (exit code ", exit_code,
                            ") but its end did not finish within --step-timeout ", seconds_text(timeout_seconds), ": ",
                            peers ? "a peer rank stopped, died or lost its network before MPI's end, or a file "
                                    "system that does not answer?"
                                  : "a file system that does not answer?",
                            " Exiting with code ", exit_code, " now"),
             exit_code);
}

void bound_the_exit(double seconds, int exit_code) {
  exit_after(seconds,
             detail::concat("hpctrain: warning: the libraries' exit handlers did not finish within ",
                            seconds_text(seconds), " (OpenBLAS's threads, which retry an allocation for ever under a "
                            "memory limit such as ulimit -v?): exiting with code ", exit_code, " now"),
             exit_code);
}

StepWatchdog::StepWatchdog(double timeout_seconds, std::string where, Expire expire, Poll poll, Watched watched,
                           bool peers)
    : timeout_(timeout_seconds),
      where_(std::move(where)),
      watched_(watched),
      peers_(peers),
      expire_(expire ? std::move(expire) : print_and_exit),
      poll_(std::move(poll)) {
  last_ns_ = now_ns();
  if (timeout_ > 0) thread_ = std::thread([this] { run(); });
}

StepWatchdog::~StepWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void StepWatchdog::progress(int64_t step) {
  step_.store(step, std::memory_order_relaxed);
  writing_.store(false, std::memory_order_relaxed);
  last_ns_.store(now_ns(), std::memory_order_release);
}

void StepWatchdog::writing(int64_t checkpoint_step, uint64_t synced, bool own, bool progressed) {
  write_step_.store(checkpoint_step, std::memory_order_relaxed);
  write_synced_.store(synced, std::memory_order_relaxed);
  own_write_.store(own, std::memory_order_relaxed);
  writing_.store(true, std::memory_order_relaxed);
  if (progressed) last_ns_.store(now_ns(), std::memory_order_release);
}

void StepWatchdog::hold_for(double seconds) {
  last_ns_.store(now_ns() + static_cast<int64_t>(std::max(0.0, seconds) * 1e9), std::memory_order_release);
  cv_.notify_all();  // its next wake-up moves
}

void StepWatchdog::run() {
  const auto timeout_ns = static_cast<int64_t>(timeout_ * 1e9);
  int64_t warned_for = -1;  // the progress mark already warned about
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (poll_)
      if (const std::string error = poll_(); !error.empty()) {
        expire_(detail::concat(where_, ": ", error, " Exiting with code ", kExitStepTimeout,
                               " so that the job can be relaunched from its last checkpoint"));
        return;
      }
    const int64_t last = last_ns_.load(std::memory_order_acquire);
    const int64_t idle = now_ns() - last;
    if (idle >= timeout_ns) {
      expire_(expired_message());
      return;
    }
    if (idle >= timeout_ns / 2 && warned_for != last) {
      warned_for = last;
      log::warn(late_message(idle * 1e-9));
    }
    // Wake at the next moment something can be due: the warning, the timeout or the poll.
    // While held (idle negative) it looks every poll period: progress() ends a hold early and
    // wakes no one.
    int64_t next = idle < timeout_ns / 2 ? timeout_ns / 2 - idle : timeout_ns - idle;
    if (poll_ || idle < 0) next = std::min<int64_t>(next, static_cast<int64_t>(kPollSeconds * 1e9));
    cv_.wait_for(lock, std::chrono::nanoseconds(std::max<int64_t>(next, 1000000)));
  }
}

const char* StepWatchdog::timeout_option() const {
  return watched_ == Watched::SetUp || watched_ == Watched::EvaluationSetUp ? "--start-timeout" : "--step-timeout";
}

// The wait for a checkpoint's write, in words: "the checkpoint of step S" and how far it came.
std::string StepWatchdog::write_text() const {
  return detail::concat(own_write_.load() ? "the checkpoint of step " : "rank 0's checkpoint of step ",
                        write_step_.load());
}

std::string StepWatchdog::written_text() const {
  return detail::concat(write_synced_.load(), " bytes written and synced");
}

std::string StepWatchdog::expired_message() const {
  const std::string timeout = seconds_text(timeout_);
  const char* while_starting = peers_ ? "a peer rank stopped, died or lost its network while starting?"
                                      : "a file system or device that does not answer?";
  const char* inside = peers_ ? "a peer rank stopped, died or lost its network inside a collective?"
                              : "a file system or device that does not answer?";
  std::string what;
  if (writing_.load()) {  // (only training's watchdogs, Steps and SetUp, are told of writes)
    what = detail::concat(write_text(), " made no progress within ", timeout_option(), " ", timeout, " (",
                          written_text(), "): ",
                          own_write_.load() ? "a file system that does not answer?"
                                            : "its file system does not answer, or rank 0 stopped, died or lost its "
                                              "network?");
  } else {
    switch (watched_) {
      case Watched::SetUp:
      case Watched::EvaluationSetUp:
        what = detail::concat("set-up did not end within --start-timeout ", timeout, ": ", while_starting);
        break;
      case Watched::EvaluationBatches:
        what = detail::concat("no evaluation batch finished within --step-timeout ", timeout, " (the last was batch ",
                              step_.load(), "): ", inside);
        break;
      case Watched::Steps:
        what = detail::concat("no step finished within --step-timeout ", timeout, " (the last was step ",
                              step_.load(), "): ", inside);
        break;
    }
  }
  const bool training = watched_ == Watched::Steps || watched_ == Watched::SetUp;
  return detail::concat(where_, ": ", what, " Exiting with code ", kExitStepTimeout,
                        training ? " so that the job can be relaunched from its last checkpoint" : "");
}

std::string StepWatchdog::late_message(double idle_seconds) const {
  const std::string idle = seconds_text(idle_seconds), timeout = seconds_text(timeout_);
  if (writing_.load())
    return detail::concat(where_, ": ", write_text(), " has made no progress for ", idle, " (", written_text(),
                          "); waiting for a file system? (", timeout_option(), " ", timeout, ")");
  const char* waiting = peers_ ? "waiting for a peer?" : "waiting for a file system or device?";
  switch (watched_) {
    case Watched::SetUp:
    case Watched::EvaluationSetUp:
      return detail::concat(where_, ": set-up has taken ", idle, "; ", waiting, " (--start-timeout ", timeout, ")");
    case Watched::EvaluationBatches:
      return detail::concat(where_, ": no evaluation batch finished for ", idle, " since batch ", step_.load(), "; ",
                            waiting, " (--step-timeout ", timeout, ")");
    case Watched::Steps:
      break;
  }
  return detail::concat(where_, ": no step finished for ", idle, " since step ", step_.load(), "; ", waiting,
                        " (--step-timeout ", timeout, ")");
}

}  // namespace hpc::train

#include "train/signals.hpp"

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <thread>

namespace hpc::train {
namespace {

std::atomic<int> g_signal{0};
std::atomic<bool> g_armed{false};
std::atomic<bool> g_started{false};

constexpr int kSignals[] = {SIGTERM, SIGUSR1, SIGINT};

sigset_t handled_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : kSignals) sigaddset(&set, sig);
  return set;
}

[[noreturn]] void exit_at_once(int sig, bool say) {
  if (say) {
    static const char msg[] = "hpctrain: stopping at once (second signal)\n";
    [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, msg, sizeof msg - 1);
  }
  ::_exit(128 + sig);
}

// Async-signal-safe (atomics, write, _exit): also run as a handler.
void take(int sig) {
  if (!g_armed.load()) exit_at_once(sig, false);  // outside the training loop: the default action
  if (sig == SIGINT || (sig == SIGTERM && g_signal.load() != 0)) exit_at_once(sig, true);
  int expected = 0;
  g_signal.compare_exchange_strong(expected, sig);
}

extern "C" void on_signal(int sig) { take(sig); }

void watch(sigset_t set) {
  for (;;) {
    int sig = 0;
    if (sigwait(&set, &sig) == 0) take(sig);
  }
}

}  // namespace

void start_signal_thread() {
  if (g_started.exchange(true)) return;
  const sigset_t set = handled_signals();
  // Threads libraries started before main() (OpenBLAS's pool) do not block them: a signal that
  // lands there runs the same code as a handler.
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : kSignals) sigaction(sig, &sa, nullptr);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);  // inherited by every thread started from now on
  std::thread(watch, set).detach();
}

StopSignals::StopSignals() {
  g_signal = 0;
  g_armed = true;
}

StopSignals::~StopSignals() { g_armed = false; }

bool StopSignals::requested() { return g_signal.load() != 0; }
int StopSignals::signal_number() { return g_signal.load(); }

void StopSignals::raise_and_wait(int sig) {
  ::kill(::getpid(), sig);  // to the process (raise() would target this thread, which blocks it)
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (!requested() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

}  // namespace hpc::train

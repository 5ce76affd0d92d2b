#include "train/signals.hpp"

#include <unistd.h>

#include <atomic>
#include <csignal>

namespace hpc::train {
namespace {

std::atomic<int> g_signal{0};
struct sigaction g_old_term, g_old_usr1, g_old_int;

extern "C" void on_stop_signal(int sig) {
  // Only async-signal-safe calls here: an atomic store, write and _exit.
  if (sig == SIGINT || (sig == SIGTERM && g_signal.load() != 0)) {
    static const char msg[] = "hpctrain: stopping at once (second signal)\n";
    [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, msg, sizeof msg - 1);
    ::_exit(128 + sig);
  }
  int expected = 0;
  g_signal.compare_exchange_strong(expected, sig);
}

void install(int sig, struct sigaction* old) {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(sig, &sa, old);
}

}  // namespace

StopSignals::StopSignals() {
  g_signal = 0;
  install(SIGTERM, &g_old_term);
  install(SIGUSR1, &g_old_usr1);
  install(SIGINT, &g_old_int);
}

StopSignals::~StopSignals() {
  sigaction(SIGTERM, &g_old_term, nullptr);
  sigaction(SIGUSR1, &g_old_usr1, nullptr);
  sigaction(SIGINT, &g_old_int, nullptr);
}

bool StopSignals::requested() { return g_signal.load() != 0; }
int StopSignals::signal_number() { return g_signal.load(); }

}  // namespace hpc::train

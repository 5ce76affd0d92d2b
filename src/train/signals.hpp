// Stop requests by signal: SIGTERM or SIGUSR1 (Slurm --signal, scancel, a spot interruption
// notice, hpcrun) ask the job to stop at the next step boundary after a checkpoint; a second
// SIGTERM, or SIGINT, ends the process at once.
//
// No thread is ever interrupted by these signals: start_signal_thread(), called first in main()
// before MPI or anything else starts a thread, blocks them in every thread and takes them on one
// thread of its own with sigwait(). (With a handler, a signal landing on a library's thread in
// the middle of a system call was seen to corrupt the heap now and then: 1 stop in ~10.)
#pragma once

#include "train/exit_codes.hpp"  // kExitCheckpointed: the exit code after such a stop

namespace hpc::train {

void start_signal_thread();

// While one exists (the training loop), SIGTERM and SIGUSR1 request a stop; at other times
// they end the process at once, as their default actions would.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // Whether a stop was asked for on this process, and by which signal (0: none).
  static bool requested();
  static int signal_number();
  // Sends `sig` to this process and waits (up to a second) until the signal thread has taken
  // it, so that a test hook's stop lands at the step it names.
  static void raise_and_wait(int sig);
};

}  // namespace hpc::train

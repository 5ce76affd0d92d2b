// Stop requests by signal: SIGTERM or SIGUSR1 (Slurm --signal, scancel, a spot interruption
// notice, hpcrun) ask a training run to stop, from the moment main() starts: at the next step
// boundary after a checkpoint, or, before the first step, at the end of the set-up phase the
// request came in (trainer.cpp), on every rank alike. A second SIGTERM, or SIGINT, ends the
// process at once; so does any of them in a command that has nothing to save (evaluate, inspect).
// Every one of these ends says so in one line on stderr.
//
// No thread is ever interrupted by these signals: they are blocked before any library starts a
// thread (block_stop_signals), and start_signal_thread(), called first in main(), takes them on
// one thread of its own with sigwait(). (With a handler, a signal landing on a library's thread in
// the middle of a system call was seen to corrupt the heap now and then: 1 stop in ~10.)
#pragma once

#include <string>

#include "train/exit_codes.hpp"  // kExitCheckpointed: the exit code after such a stop

namespace hpc::train {

enum class OnStopSignal {
  Request,  // training: SIGTERM and SIGUSR1 ask for a stop, which the trainer honours
  Exit,     // nothing to save: they end the process at once, as SIGINT does
};

void start_signal_thread(OnStopSignal mode);

// Blocks the stop signals in the calling thread and in every thread it starts from then on: a
// stop signal that comes earlier than start_signal_thread() waits for it instead of killing the
// process. hpctrain's main file runs it before the shared libraries' initialisers (which start
// thread pools), from .preinit_array; async-signal-safe.
void block_stop_signals();

class StopSignals {
 public:
  // Whether a stop was asked for on this process, and by which signal (0: none).
  static bool requested();
  static int signal_number();
  // Sends `sig` to this process and waits (up to a second) until the signal thread has taken
  // it, so that a test hook's stop lands at the step it names.
  static void raise_and_wait(int sig);
};

// "SIGTERM", "SIGUSR1", "SIGINT"; "signal N" for others.
std::string signal_name(int sig);

}  // namespace hpc::train

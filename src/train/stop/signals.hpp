// Stop requests by signal: the stop signals (--stop-signals, by default SIGTERM, SIGUSR1, SIGUSR2
// and SIGHUP: Slurm's --signal, scancel, submitit, Lightning, a spot interruption notice, hpcrun)
// ask a training run to stop, from the moment main() starts: at the next step boundary after a
// checkpoint, or, before the first step, at the end of the set-up phase the request came in
// (trainer.cpp), on every rank alike. A second SIGTERM (more than 5 s after the first: Slurm
// sends two at once, its own and srun's), or SIGINT, ends the process at once; so
// does any of them in a command that has nothing to save (evaluate, inspect). One of the four
// left out of --stop-signals takes its default action (the process ends by it). Every one of
// these ends says so in one line on stderr, until the outcome is final (outcome_is_final).
//
// No thread is ever interrupted by these signals: they are blocked before any library starts a
// thread (block_stop_signals), and start_signal_thread(), called first in main(), takes them on
// one thread of its own with sigwait(). (With a handler, a signal landing on a library's thread in
// the middle of a system call was seen to corrupt the heap now and then: 1 stop in ~10.) One that
// comes before the options are read waits for them (use_stop_signals) to know what it means.
#pragma once

#include <string>
#include <vector>

#include "core/exit_codes.hpp"  // kExitCheckpointed: the exit code after such a stop

namespace hpc::train {

enum class OnStopSignal {
  Request,  // training: the stop signals ask for a stop, which the trainer honours
  Exit,     // nothing to save: they end the process at once, as SIGINT does
};

void start_signal_thread(OnStopSignal mode);

// The signals --stop-signals may name, its default, and its value parsed ("TERM,USR1": names
// with or without SIG, in any case; a usage error, exit 2, for an unknown or uncatchable one, one
// outside these four, a repeated one or none) and written back ("TERM,USR1").
std::vector<int> stop_signal_choices();  // SIGTERM, SIGUSR1, SIGUSR2, SIGHUP
std::vector<int> parse_stop_signals(const std::string& list);
std::string stop_signals_text(const std::vector<int>& signals);

// Training's --stop-signals, once its options are read: from then on a signal of
// stop_signal_choices() outside `signals` takes its default action; one that came earlier is
// decided now.
void use_stop_signals(const std::vector<int>& signals);

// For a wait before the options are read that may never end on its own (--config naming a FIFO
// or pipe that nothing writes to), checked between short slices of it: a stop signal taken
// meanwhile, which would otherwise wait for options that never come, ends the process at once
// (128 + the signal; one line naming `what` it waited for: there is nothing to save yet). None
// taken: it returns.
void end_wait_if_stopped(const std::string& what);

// Blocks the stop signals in the calling thread and in every thread it starts from then on: a
// stop signal that comes earlier than start_signal_thread() waits for it instead of killing the
// process. hpctrain's main file runs it before the shared libraries' initialisers (which start
// thread pools), from .preinit_array; async-signal-safe.
void block_stop_signals();

// The process's outcome is final: its exit code is decided, its files are closed and its lines
// written (the standard streams are flushed here); MPI's end and the process's own are all that
// is left. From now on any of these signals ends the process at once, with that code and without
// a line: there is nothing left to save or to say. (mpirun sends SIGTERM to the ranks still there
// once one has exited with a code other than 0; a rank a moment behind, ending its process after
// MPI_Finalize, would otherwise print "already stopping" and be killed a second later.)
void outcome_is_final(int exit_code);

class StopSignals {
 public:
  // Whether a stop was asked for on this process, and by which signal (0: none).
  static bool requested();
  static int signal_number();
  // Sends `sig` to this process and waits (up to a second) until the signal thread has taken
  // it, so that a test hook's stop lands at the step it names.
  static void raise_and_wait(int sig);
};

// "SIGTERM", "SIGUSR2", "SIGHUP"; "signal N" for one without a name.
std::string signal_name(int sig);
// The signal named "TERM", "SIGTERM" or "term" (0: none such).
int signal_number_of(const std::string& name);

}  // namespace hpc::train

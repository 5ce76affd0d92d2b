// Stop requests by signal: SIGTERM or SIGUSR1 (Slurm --signal, scancel, a spot interruption
// notice, hpcrun) ask the job to stop at the next step boundary after a checkpoint; a second
// SIGTERM, or SIGINT, ends the process at once. Installed for the training loop's lifetime.
#pragma once

namespace hpc::train {

// Exit code of a job that stopped on request after writing its checkpoint: "requeue me".
// (EX_TEMPFAIL of sysexits.h; distinct from success 0, failure 1 and usage errors 2.)
constexpr int kExitCheckpointed = 75;

class StopSignals {
 public:
  StopSignals();   // installs the handlers
  ~StopSignals();  // restores the previous ones
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // Whether a stop was asked for on this process, and by which signal (0: none).
  static bool requested();
  static int signal_number();
};

}  // namespace hpc::train

// Stop requests by signal: SIGTERM or SIGUSR1 (Slurm --signal, scancel, a spot interruption
// notice, hpcrun) ask the job to stop at the next step boundary after a checkpoint; a second
// SIGTERM, or SIGINT, ends the process at once. Installed for the training loop's lifetime.
#pragma once

#include "train/exit_codes.hpp"  // kExitCheckpointed: the exit code after such a stop

namespace hpc::train {

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

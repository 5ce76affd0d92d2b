// The exit codes of hpctrain, a contract with launchers and batch scripts (README, "Exit
// codes"): hpcrun and the sbatch scripts decide from them whether to requeue, relaunch or give up.
#pragma once

namespace hpc::train {

constexpr int kExitSuccess = 0;
constexpr int kExitFailure = 1;  // hpctrain's own failure (hpc::ErrorKind::Internal)
constexpr int kExitUsage = 2;    // the user's input: flags, files, a checkpoint that does not fit
// Stopped on request (a stop signal: --stop-signals) after writing a checkpoint: "requeue me".
// (EX_TEMPFAIL of sysexits.h.)
constexpr int kExitCheckpointed = 75;
// The step watchdog fired: no step finished within --step-timeout, a peer hangs or died inside
// a collective. Relaunching from the last checkpoint (on the healthy hosts) is the cure.
// (124 is what timeout(1) exits with when its command ran out of time.)
constexpr int kExitStepTimeout = 124;

}  // namespace hpc::train

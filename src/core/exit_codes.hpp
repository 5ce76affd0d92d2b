// The exit codes of hpctrain and hpcrun, a contract with launchers and batch scripts (README,
// "Exit codes" and "hpcrun"): hpcrun and the sbatch scripts decide from them whether to requeue,
// relaunch or give up. In core/ because both sides read them: the trainer (train/) and the
// launcher (launch/), which stands beside it, not on it.
#pragma once

namespace hpc {

constexpr int kExitSuccess = 0;
constexpr int kExitFailure = 1;  // hpctrain's own failure (hpc::ErrorKind::Internal)
constexpr int kExitUsage = 2;    // the user's input: flags, files, a checkpoint that does not fit
// Stopped on request (a stop signal: --stop-signals) after writing a checkpoint: "requeue me".
// (EX_TEMPFAIL of sysexits.h.)
constexpr int kExitCheckpointed = 75;
// A watchdog fired: no step finished within --step-timeout (or set-up did not end within
// --start-timeout), a peer hangs or died inside a collective. Relaunching from the last
// checkpoint (on the healthy hosts) is the cure.
// (124 is what timeout(1) exits with when its command ran out of time.)
constexpr int kExitStepTimeout = 124;

// hpcrun's own: 0 when the job finished, kExitUsage for bad input (its own or the program's),
// kExitCheckpointed when the job stopped after a checkpoint (a signal, Slurm's preemption: "run me
// again"), and these two.
constexpr int kExitGaveUp = 1;    // --max-restarts failures, or no hosts within --elastic-timeout
constexpr int kExitKilled = 130;  // a second signal: killed without a checkpoint

}  // namespace hpc

#include "relaunch_policy.hpp"

#include "core/exit_codes.hpp"

namespace hpc::launch {

namespace {

Decision finish(int code, std::string last_line) {
  Decision d;
  d.exit_code = code;
  d.last_line = std::move(last_line);
  return d;
}

// A job that failed by itself: its lost hosts wait out a cooldown, and it goes on without them.
Decision after_failure(const AttemptFacts& f, int failures, int max_restarts) {
  const int count = failures + 1;
  Decision d;
  d.failure = true;
  d.blacklist = f.failed_hosts;
  if (count > max_restarts) {
    d.exit_code = kExitGaveUp;
    d.last_line = "gave up: " + std::to_string(count) + " failure(s), --max-restarts is " +
                  std::to_string(max_restarts) + "; the last: " + f.outcome;
    return d;
  }
  d.next = Next::Relaunch;
  d.relaunch_line = "relaunching from the newest saved state, a host's snapshot or a checkpoint (restart " +
                    std::to_string(count) + " of " + std::to_string(max_restarts) + ")";
  return d;
}

}  // namespace

bool asks_slurm(Verdict verdict, bool interrupted) { return verdict == Verdict::Failure && !interrupted; }

Decision decide_after_attempt(const AttemptFacts& f, int failures, int max_restarts) {
  switch (f.verdict) {
    case Verdict::Success: return finish(kExitSuccess, "");
    case Verdict::UsageError:
      // Its own words last, where a batch log's reader looks first.
      return finish(kExitUsage, "gave up: " + (f.program_error.empty() ? f.outcome
                                                                       : "the program's usage error: " + f.program_error));
    case Verdict::StoppedOutside:
      return finish(kExitCheckpointed, "the job stopped itself after a checkpoint; run hpcrun again to resume");
    case Verdict::Stopped:
      if (f.membership && !f.interrupted) {
        Decision d;
        d.next = Next::Relaunch;  // on the hosts that are healthy now: grown, or without the one drained
        return d;
      }
      return finish(f.interrupted ? kExitCheckpointed : kExitGaveUp, "stopped; run hpcrun again to resume");
    case Verdict::Failure:
      if (f.killed) return finish(kExitKilled, "killed on request");
      // One signal, and the attempt failed by itself meanwhile (or the signal came as it ended):
      // a stop all the same, from the newest saved state; 130 is a second signal's.
      if (f.interrupted)
        return finish(kExitCheckpointed, "the attempt failed while hpcrun was asked to stop: nothing relaunched; run "
                                         "hpcrun again to resume from the newest saved state");
      // Preemption signals every step of the job, mpirun's daemons too, which end the ranks: it
      // looks like lost hosts, but relaunching inside an allocation Slurm is taking back only races
      // its grace time. 75: the batch script requeues the job, which resumes.
      if (!f.preempted_at.empty())
        return finish(kExitCheckpointed, "Slurm chose this job for preemption at " + f.preempted_at +
                                             " and ended its steps: not a host failure, nothing relaunched; the "
                                             "batch script requeues it (exit 75), and it resumes from the last "
                                             "checkpoint");
      return after_failure(f, failures, max_restarts);
  }
  return finish(kExitGaveUp, "gave up: an attempt ended in a way hpcrun does not know");
}

int exit_without_hosts(bool interrupted) { return interrupted ? kExitCheckpointed : kExitGaveUp; }

}  // namespace hpc::launch

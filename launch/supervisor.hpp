// hpcrun's job loop: choose healthy hosts (host_pool.hpp), start and watch one attempt of the job
// through mpirun (attempt.hpp), and after it ends decide (relaunch_policy.hpp): done, give up, or
// relaunch from the newest saved state on the hosts that are healthy now; at the end, the summary.
#pragma once

#include <string>
#include <vector>

#include "attempt.hpp"
#include "host_pool.hpp"
#include "job_context.hpp"
#include "options.hpp"

namespace hpc::launch {

// What a run's snapshots in host memory hold past its newest checkpoint as the job ends, judged
// once for persisting and freeing them (supervisor.cpp, snapshots_held): Past, steps the
// checkpoints lack; Maybe, perhaps (its rank 0 was killed in training); None. newest: that
// checkpoint's step (-1 for none); beat: the heartbeat's.
struct SnapshotsHeld {
  enum class Newer { None, Maybe, Past } newer = Newer::None;
  int64_t newest = -1, beat = -1;
};

class Supervisor {
 public:
  explicit Supervisor(LaunchOptions options);
  int run();  // hpcrun's exit code

 private:
  double now() const { return clock_.now(); }
  void say(const std::string& line) { voice_.say(line); }
  void open_logs();  // creates --log-dir; until then say() keeps its lines for hpcrun.log

  // Before the first launch: mpirun's own usage errors, found by a run that starts nothing.
  void check_mpirun_accepts(const HostList& placement);
  // ... and the MCA settings in --mpi-args that mpirun takes without a word (mca.hpp).
  void check_mca_settings();
  // Inside a Slurm job: when Slurm chose it for preemption ("" when not, or not in Slurm).
  std::string slurm_preemption() const;
  // A --straggler-* option given to a job that gives it no heartbeat to judge by: one warning, at
  // the first moment hpcrun knows (before the first attempt without a checkpoint directory, else
  // after the first attempt of a program other than hpctrain that wrote none).
  void warn_stragglers_unjudged(const AttemptRecord* ended);
  // After an attempt that trained a step: a given --resume none or FILE becomes auto.
  void resume_auto_after(const AttemptRecord& ended);

  // The summary (summary.cpp)
  int finish(int code, const std::string& last_line);
  // The hosts of the job's attempts that answer a probe now, one slot each (after_success: only
  // those the last attempt did not run on).
  HostList answering_hosts(bool after_success);
  // hpctrain's `command` once on each of `hosts`, through mpirun, its lines said.
  CommandResult run_on_hosts(const HostList& hosts, const std::vector<std::string>& command, double timeout);
  // What the snapshots hold as the job ends with `code` (nothing judged for a kill, 130).
  SnapshotsHeld snapshots_held(int code);
  // At the end of a job (not a success, not killed) whose snapshots `held` steps past its newest
  // checkpoint: the newest snapshot in host memory written there (hpctrain persist-snapshot).
  // Whether it did its part (true also where they held nothing newer).
  bool persist_snapshots(int code, const SnapshotsHeld& held);
  // At the end of a job that no relaunch continues (not a stop, exit 75): the run's snapshots in
  // host memory go, on every host of its attempts that still answers (hpctrain clean-snapshots
  // --run-id, through mpirun), unless they hold (or, the run killed in training, may hold) steps
  // past the newest checkpoint and were not `persisted`. A finished run removes its own; this
  // reaches the hosts it left (after a success, those alone).
  void free_snapshots(int code, bool persisted, const SnapshotsHeld& held);
  void print_summary();
  void write_summary_json(int exit_code);

  LaunchOptions o_;
  Clock clock_;
  Voice voice_;
  SignalInbox signals_;
  HostPool hosts_;
  HeartbeatWatch heartbeat_;
  int failures_ = 0, first_attempt_ = 1;
  bool stragglers_warned_ = false;
  // summary.json: the step persist-snapshot wrote as a checkpoint (-1: none), and what became of
  // the run's snapshots in host memory ("freed", "kept"; "" where hpcrun did neither).
  int64_t persisted_step_ = -1;
  std::string snapshots_fate_;
  std::vector<AttemptRecord> attempts_;
  std::string self_exe_;
};

}  // namespace hpc::launch

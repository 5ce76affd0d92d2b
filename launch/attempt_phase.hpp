// Where one attempt stands, as a phase with one deadline, and what hpcrun does when that deadline
// passes. Pure (no clock, no signals, no I/O), so that every path is unit-tested
// (tests/unit/launch_test.cpp); the supervisor feeds it events and carries out its actions.
//
//   Starting ──first step (or 10 s without a heartbeat)──► Running
//      │ no first step within --start-timeout of the launch, or no step within --stall-timeout
//      │ of the last one
//      ▼
//   Querying ─ the ranks are asked which of them respond (SIGUSR2); after min(2 s, --teardown-timeout):
//   Stopping ─ asked to checkpoint and stop (a signal, growth, a drain); after --stop-timeout:
//      ▼                                                        ▼
//   Terminating (SIGTERM sent) ──3 s, or --teardown-timeout after a query──► Killed (SIGKILL sent)
//   TearingDown ─ a rank failed: mpirun ends the rest; after --teardown-timeout ──► Killed
//   Draining ─ mpirun is gone; its launch agents may hold its pipes: after 2 s they are killed.
//
// A phase that waits for the job to end (Stopping, Querying, TearingDown) gives way to another only
// if that one's deadline comes sooner: two reasons to end the job at once are escalated by
// whichever runs out first.
#pragma once

#include <limits>

namespace hpc::launch {

enum class Phase { Starting, Running, Querying, Stopping, TearingDown, Terminating, Killed, Draining };
const char* phase_name(Phase p);

// What to do to mpirun.
enum class Action {
  None,
  QueryLiveness,  // SIGUSR2 to mpirun: each rank's wrapper answers whether it is alive
  Terminate,      // SIGTERM to mpirun's process group
  Kill,           // SIGKILL to mpirun's process group
  CloseOutput,    // SIGKILL to what is left of the group, and stop reading mpirun's pipes
};

struct PhaseTimeouts {
  bool heartbeat = false;  // the job writes a heartbeat (hpcrun knows when it runs and when it stalls)
  double stall = 0;        // --stall-timeout; 0: off
  double stop = 300;       // --stop-timeout
  double teardown = 10;    // --teardown-timeout
  double start = 0;        // --start-timeout (from the launch to the first step); 0: no limit
};

// What passed a deadline: the phase it ended, and what hpcrun must do now.
struct Escalation {
  Phase from = Phase::Starting;
  Action action = Action::None;
};

class AttemptPhase {
 public:
  static constexpr double kNever = std::numeric_limits<double>::infinity();
  static constexpr double kStartupGrace = 10;  // without a heartbeat: running after this long
  static constexpr double kTerminateGrace = 3;  // from SIGTERM (a stop timeout, a second signal) to SIGKILL
  static constexpr double kQueryWait = 2;       // for the liveness answers (at most --teardown-timeout)
  static constexpr double kDrainGrace = 2;      // for launch agents to close mpirun's pipes

  AttemptPhase(const PhaseTimeouts& timeouts, double start);

  Phase phase() const { return phase_; }
  double deadline() const { return deadline_; }
  bool stalled() const { return stalled_; }
  bool stalled_starting() const { return stalled_starting_; }  // before its first step
  // Growth and draining are decided only while the job runs undisturbed.
  bool running() const { return phase_ == Phase::Running; }
  bool mpirun_gone() const { return phase_ == Phase::Draining; }

  // Events. Each may move to another phase; none acts on mpirun by itself.
  void progress(double t);          // the heartbeat showed a finished step
  // The heartbeat showed a checkpoint's write that moves (a chunk synced, no step): life while
  // running, as a step is; while stopping, --stop-timeout counts from it (a slow file system's
  // stop checkpoint, not a hang: hpctrain's watchdog ends one that makes no progress).
  void writing(double t);
  // hpcrun asked the job to checkpoint and stop; asked again while stopping (a signal after a
  // request to grow or drain), the --stop-timeout starts again.
  void stop_requested(double t);
  void failure_seen(double t);      // a rank failed, or mpirun named a lost host
  // While Starting: the program waits for what another process holds (the checkpoint directory's
  // lock, which its own --checkpoint-lock-wait bounds), so --start-timeout counts from `t`.
  void start_held(double t);
  Action kill_requested(double t);  // a second signal to hpcrun: Terminate, unless already ending it
  void exited(double t);            // mpirun is gone

  // The one place that escalates: past the deadline, the next phase and what to do to mpirun.
  // Before it, nothing (action None).
  Escalation escalate(double t);

 private:
  void enter(Phase p, double deadline);
  // A phase that waits for the job to end, unless the current one ends it sooner.
  void wait_for_end(Phase p, double deadline);
  // In Starting or Running (`p`): when the job counts as running, or stalled.
  double watch_deadline(Phase p) const;

  PhaseTimeouts timeouts_;
  Phase phase_ = Phase::Starting;
  double deadline_ = kNever;
  double start_ = 0, last_progress_ = 0;
  bool stalled_ = false, stalled_starting_ = false;
};

}  // namespace hpc::launch

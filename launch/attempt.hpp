// One attempt: mpirun started on a placement, watched until it and its output are gone, judged.
// The watch loop's state is the attempt's phase (attempt_phase.hpp); each pass reads output,
// notes mpirun's exit, takes hpcrun's signals, reads the heartbeat, escalates a phase whose
// deadline passed, and decides on growth and draining, each in its own step. What follows the
// attempt (relaunch, give up) is the job loop's (supervisor.hpp, relaunch_policy.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "analysis.hpp"
#include "attempt_phase.hpp"
#include "host_pool.hpp"
#include "job_context.hpp"
#include "options.hpp"
#include "straggler_policy.hpp"
#include "subprocess.hpp"

namespace hpc::launch {

// One launch of the job, as the summary and summary.json show it.
struct AttemptRecord {
  int number = 0;
  HostList hosts;
  int np = 0;
  double start = 0, end = 0;  // seconds since hpcrun started
  Verdict verdict = Verdict::Failure;
  bool membership = false;    // stopped by hpcrun to grow or drain the job
  std::string outcome;        // one line
  std::string program_error;  // for a usage error: the program's own error line
  std::vector<std::string> failed_hosts;
  int64_t first_step = -1, last_step = -1;  // global steps the heartbeat showed during the attempt
  double first_step_at = -1, last_step_at = -1;  // when the first and the last of them were seen
  // The step of the state the attempt resumed (-1: none, or unknown) and where that state was:
  // "snapshot" (a host's memory), "checkpoint" (shared storage), "none" (a fresh start).
  int64_t resumed_from = -1;
  std::string resumed_source;
  double failed_at = -1;                     // when hpcrun learned of the failure
  bool killed_on_request = false;            // by a second signal to hpcrun

  // Whether the program said it started afresh (hpctrain: resumed_source=none, resumed_from=-1).
  bool started_afresh() const { return resumed_source == "none" || (!resumed_source.empty() && resumed_from < 0); }
};

// mpirun's words for the job on `placement`: each rank is hpcrun's wrapper (`self_exe
// --rank-exec`) around the program.
std::vector<std::string> mpirun_command(const LaunchOptions& o, const HostList& placement, const std::string& self_exe);
// The same mpirun (launch agent or srun, -x, --mpi-args) running `program` on `placement` as
// itself: no wrapper, no tags, no map.
std::vector<std::string> mpirun_running(const LaunchOptions& o, const HostList& placement,
                                        const std::vector<std::string>& program);

// What the job loop lends each attempt.
struct JobContext {
  const LaunchOptions& o;
  const Clock& clock;
  Voice& voice;
  SignalInbox& signals;
  HostPool& hosts;
  HeartbeatWatch& heartbeat;
  std::string self_exe;
};

class AttemptWatcher {
 public:
  // Attempt `number` on `placement`, after `restarts` failures of the job (HPCRUN_RESTART_COUNT).
  AttemptWatcher(const JobContext& job, int number, int restarts, const HostList& placement);
  // Starts mpirun and watches it until it and its output are gone; then judges the attempt.
  AttemptRecord run();

 private:
  enum class StopKind { None, User, Membership };
  struct Stop {
    StopKind kind = StopKind::None;
    std::string why;
    std::string leaving;  // the host a drain takes out of the job ("": none, a grow)
  };

  double now() const { return job_.clock.now(); }
  void say(const std::string& line) { job_.voice.say(line); }
  void start();
  void set_env();
  AttemptRecord conclude(const ExitStatus& status);
  // The watch loop's steps, in the order each pass takes them.
  void read_output();  // waits up to 100 ms for output (or a signal)
  void read_stream(int fd);
  void check_exit(double t, ExitStatus* status);
  void take_signals(double t);
  void watch_heartbeat(double t);
  void watch_lock(double t);  // before the first step: whether rank 0 waits for another's lock
  void deliver_stop(double t);  // SIGUSR1 to mpirun once it takes it, again at the first step
  bool record_beat(double t);  // the heartbeat's step, where it changed and is this attempt's
  void watch_stragglers(double t);  // the heartbeat's slowest rank, each time it changed
  void escalate(double t);          // the attempt's phase past its deadline: what hpcrun does
  void watch_membership(double t);
  // Output
  void handle_output(const std::string& line, bool from_stderr);
  bool keep_off_terminal(const TaggedLine& t) const;
  bool take_map_line(const std::string& text);  // whether it is a line of mpirun's process map
  void place_ranks_once();                      // evidence_.rank_hosts from the map, or a warning
  void note_failure();
  // After a failed start that blamed no host: the hosts where mpirun cannot start its daemon.
  void find_daemonless(Analysis* an);
  void check_membership();
  void request_stop(StopKind kind, const std::string& why, const std::string& leaving = "");

  JobContext job_;
  const LaunchOptions& o_;
  int restarts_;
  AttemptRecord rec_;
  HostList placement_;
  Child mpirun_;
  LineSplitter out_lines_, err_lines_;
  AttemptPhase phase_;
  Stop stop_;
  AttemptEvidence evidence_;
  ProcessMap process_map_;
  bool ranks_placed_ = false;
  StragglerState straggler_;
  LockWatch lock_;
  bool lock_wait_said_ = false;
  double last_beat_poll_ = 0, last_membership_ = 0, last_lock_poll_ = 0;
  bool stop_unsent_ = false;          // asked for, held back until mpirun has its handler
  bool stop_before_running_ = false;  // asked for before the first step: asked again at it
};

}  // namespace hpc::launch

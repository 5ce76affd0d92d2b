// hpcrun's loop: choose healthy hosts, start the job through mpirun, watch it (its exit, each
// rank's report, the trainer's heartbeat, the discovery script, signals), and after it ends
// decide: done, give up, or relaunch from the last checkpoint on the hosts that are healthy now.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "analysis.hpp"
#include "attempt_phase.hpp"
#include "blacklist.hpp"
#include "options.hpp"
#include "straggler_policy.hpp"
#include "subprocess.hpp"

namespace hpc::launch {

// One launch of the job.
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
};

// The trainer's heartbeat file (CHECKPOINT_DIR/heartbeat), polled.
class HeartbeatWatch {
 public:
  explicit HeartbeatWatch(std::string dir) : dir_(std::move(dir)) {}
  bool enabled() const { return !dir_.empty(); }
  // Forget what earlier attempts wrote: only changes from now on are this attempt's progress.
  void begin(double now);
  // True when the heartbeat changed since the last call (a step finished).
  bool poll(double now);
  double last_progress() const { return last_change_; }
  int64_t step() const { return step_; }
  // A heartbeat field ("" when it has none).
  std::string field(const std::string& key) const;
  bool seen() const { return seen_; }

 private:
  std::string dir_;
  std::map<std::string, std::string> last_;
  double last_change_ = 0;
  int64_t step_ = -1;
  bool seen_ = false;
};

class Supervisor {
 public:
  explicit Supervisor(LaunchOptions options);
  ~Supervisor();
  int run();  // hpcrun's exit code

 private:
  enum class StopKind { None, User, Membership };
  struct Stop {
    StopKind kind = StopKind::None;
    std::string why;
  };
  // The running attempt: what the steps of its watch loop share.
  struct Attempt {
    Attempt(AttemptRecord record, HostList hosts, AttemptPhase watch)
        : rec(std::move(record)), placement(std::move(hosts)), phase(watch) {}
    AttemptRecord rec;
    HostList placement;
    Child mpirun;
    LineSplitter out_lines, err_lines;
    AttemptPhase phase;
    Stop stop;
    AttemptEvidence evidence;
    StragglerState straggler;
    double last_beat_poll = 0, last_membership = 0;
  };

  double now() const;
  void say(const std::string& line);  // stderr and hpcrun.log
  void log_line(const std::string& line);
  void open_logs();  // creates --log-dir; until then say() keeps its lines for hpcrun.log

  // Hosts
  HostList known_hosts();       // the static list, or the discovery script's latest answer
  bool discover(bool first);    // runs the script; false when it failed (the previous answer stays)
  HostList healthy(const HostList& candidates);  // the ones not blacklisted that answer a probe
  std::vector<std::string> agent_command() const;  // --launch-agent's words, with ssh's options
  std::vector<std::string> probe_command(const std::string& host) const;
  HostList place(const HostList& usable, int np) const;
  int target_np(const HostList& usable, bool first) const;
  // Blocks until healthy hosts have --min-np slots; false after --elastic-timeout (or a stop signal).
  bool wait_for_hosts(HostList* usable, bool first);

  // Before the first launch: mpirun's own usage errors, found by a run that starts nothing.
  void check_mpirun_accepts(const HostList& placement);
  // ... and the MCA settings in --mpi-args that mpirun takes without a word (mca.hpp).
  void check_mca_settings();
  // Inside a Slurm job: when Slurm chose it for preemption ("" when not, or not in Slurm).
  std::string slurm_preemption() const;

  // One attempt (attempt.cpp): started, watched until mpirun and its output are gone, judged.
  AttemptRecord run_attempt(const HostList& placement);
  Attempt start_attempt(const HostList& placement);
  void set_attempt_env(const Attempt& a);
  std::vector<std::string> mpirun_command(const HostList& placement) const;
  AttemptRecord conclude(Attempt& a, const ExitStatus& status);
  // The watch loop's steps, in the order each pass takes them.
  void read_output(Attempt& a);  // waits up to 100 ms for output (or a signal)
  void read_stream(Attempt& a, int fd);
  void check_exit(Attempt& a, double t, ExitStatus* status);
  void take_signals(Attempt& a, double t);
  void watch_heartbeat(Attempt& a, double t);
  void watch_stragglers(Attempt& a, double t);  // the heartbeat's slowest rank, each time it changed
  void escalate(Attempt& a, double t);  // the attempt's phase past its deadline: what hpcrun does
  void watch_membership(Attempt& a, double t);
  // Output
  void handle_output(Attempt& a, const std::string& line, bool from_stderr);
  bool keep_off_terminal(const Attempt& a, const TaggedLine& t) const;
  void note_failure(Attempt& a);
  void check_membership(Attempt& a);
  // Whether the known hosts, but `host` and the blacklisted, have --min-np slots.
  bool enough_slots_without(const std::string& host);
  std::string joining_hosts(const HostList& placement, const HostList& known);
  void request_stop(Attempt& a, StopKind kind, const std::string& why);
  // CHECKPOINT_DIR/membership-change: present while a stop to change hosts is asked for.
  void mark_membership_change(bool on) const;
  bool take_signal(int* sig);
  int signal_fd() const;  // readable when a signal is waiting

  // The summary (summary.cpp)
  int finish(int code, const std::string& last_line);
  // At the end of a job that no relaunch continues (not a stop, exit 75): the run's snapshots in
  // host memory go, on every host of its attempts that still answers (hpctrain clean-snapshots
  // --run-id, through mpirun). A finished run removes its own; this reaches the hosts it left
  // (after a success, those alone).
  void free_snapshots(int code);
  void print_summary();
  void write_summary_json(int exit_code);

  LaunchOptions o_;
  Blacklist blacklist_;
  HeartbeatWatch heartbeat_;
  HostList discovered_;
  double started_ = 0, started_unix_ = 0, last_discovery_ = -1e9;
  int failures_ = 0, first_attempt_ = 1;
  std::vector<AttemptRecord> attempts_;
  std::ofstream attempt_log_, hpcrun_log_;
  std::vector<std::string> early_lines_;  // said before the log directory was created
  int signals_seen_ = 0;
  bool interrupted_ = false;
  std::string self_exe_;
};

}  // namespace hpc::launch

// What hpcrun's job loop (supervisor.hpp) and the attempt it watches (attempt.hpp) share: its
// clock, its voice (the terminal, hpcrun.log, the attempt's log), the signals it was sent, and the
// trainer's heartbeat. Each is owned by the Supervisor, which lends them to each attempt.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/dir_lock.hpp"

namespace hpc::launch {

// Seconds since hpcrun started (monotonic).
class Clock {
 public:
  Clock();
  double now() const;
  double started_unix() const { return started_unix_; }  // the wall clock at the start

 private:
  double started_ = 0, started_unix_ = 0;
};

// What hpcrun says: every line on stderr and in hpcrun.log (timestamped) and in the running
// attempt's log. Until --log-dir is created (not before the first launch: input refused at once
// leaves no directory behind) hpcrun.log's lines are kept and written first when it opens.
// The attempt numbers hpcrun uses and reads in a log directory's names: 1 to this, less one (a
// stray attempt-2147483647.log is no attempt of ours: its number plus one would overflow).
constexpr int kMostAttempts = 1'000'000'000;

class Voice {
 public:
  void say(const std::string& line);
  void log_line(const std::string& line);  // the attempt's log alone
  // A line of the job's output (mpirun's stdout) relayed to hpcrun's stdout. Where that cannot
  // be written (`hpcrun ... > log` on a full disk, `| head` ended; SIGPIPE is ignored) the job goes
  // on, said once: its lines are still in the attempts' logs, and a lost copy is no reason to
  // stop a training. hpcrun's exit code stays the job's.
  void relay_output(const std::string& line);
  // A line of the job's stderr (or hpcrun's own, say()'s) written to hpcrun's stderr. Where that
  // cannot be written (`2>/dev/full`, `2>&-`) the job goes on, and hpcrun.log says once that the
  // terminal's copy is lost, as every attempt's log does from then on: they hold the lines lost.
  void relay_error(const std::string& line);
  // Creates the log directory and opens hpcrun.log (once; later calls do nothing).
  void open(const std::string& log_dir);
  bool opened() const { return hpcrun_log_.is_open(); }
  // The attempt's log: LOG_DIR/attempt-N.log, made here, N the first number from `from` on that
  // no file has. Returns N and sets `path`; `from`, with no log open (attempt_log_open() false),
  // when none can be made.
  int open_attempt_log(const std::string& log_dir, int from, std::string* path);
  bool attempt_log_open() const { return attempt_log_.is_open() && attempt_log_.good(); }
  std::ofstream& attempt_log() { return attempt_log_; }

 private:
  // A timestamped line in hpcrun.log, or kept for it until open().
  void to_hpcrun_log(const std::string& line);

  std::ofstream attempt_log_, hpcrun_log_;
  std::string log_dir_;
  bool output_lost_said_ = false;
  std::string errors_lost_;  // the warning that stderr cannot be written, once said: each attempt's log starts with it
  std::vector<std::string> early_lines_;  // said before the log directory was created
};

// The signals hpcrun handles (SIGINT, SIGTERM, SIGHUP, SIGUSR1), from the handler through a pipe.
// One per process: it installs the handlers and removes them when it goes. A SIGHUP ignored when
// hpcrun starts (nohup) stays ignored; SIGCHLD takes its default action (waitpid needs it).
class SignalInbox {
 public:
  SignalInbox();
  ~SignalInbox();
  SignalInbox(const SignalInbox&) = delete;
  SignalInbox& operator=(const SignalInbox&) = delete;
  // The next signal waiting (false when none). Each one taken counts, and marks hpcrun interrupted.
  bool take(int* sig);
  int fd() const;  // readable when a signal is waiting
  int taken() const { return taken_; }
  bool interrupted() const { return taken_ > 0; }

 private:
  int taken_ = 0;
  bool hangup_ignored_ = false;  // by whoever started hpcrun
};

// The trainer's heartbeat file (CHECKPOINT_DIR/heartbeat), polled.
class HeartbeatWatch {
 public:
  explicit HeartbeatWatch(std::string dir) : dir_(std::move(dir)) {}
  bool enabled() const { return !dir_.empty(); }
  // Forget what earlier attempts wrote: only changes from now on are this attempt's progress, and
  // only beats of this hpcrun's attempt `attempt` where a beat names them (hpcrun_token=,
  // hpcrun_attempt=): not another hpcrun's job on the directory, nor a rank 0 of an earlier
  // attempt still alive on a lost host. A beat that names none (a program other than hpctrain) counts.
  void begin(double now, int attempt);
  // True when the heartbeat changed since the last call (a step finished).
  bool poll(double now);
  double last_progress() const { return last_change_; }
  int64_t step() const { return step_; }
  // A heartbeat field ("" when it has none).
  std::string field(const std::string& key) const;
  bool seen() const { return seen_; }
  // Whether the last beat says the job waits for a checkpoint's write that moves (no step).
  bool writing() const { return !field("checkpoint_step").empty(); }

 private:
  std::string dir_;
  std::map<std::string, std::string> last_;
  std::string attempt_;
  double last_change_ = 0;
  int64_t step_ = -1;
  bool seen_ = false;
};

// The checkpoint directory's lock (CHECKPOINT_DIR/lock, ckpt/dir_lock.hpp), looked at while an
// attempt starts. Held by a live process that is not the attempt's own (the rank 0 of an earlier
// attempt, on a host cut off from the others but not from the storage, which lives until its own
// watchdog ends it; another run), the attempt's rank 0 waits for it, as long as hpctrain's
// --checkpoint-lock-wait: no hang of its start-up, which --start-timeout must not end.
class LockWatch {
 public:
  explicit LockWatch(std::string dir);
  // Whether, at `now`, a live process other than hpcrun `token`'s attempt `attempt` holds it:
  // its record says "held" and has changed within the lock's stale time (the holder rewrites it
  // every few seconds; first seen counts as changed). `holder` says who.
  bool held_by_another(double now, const std::string& token, const std::string& attempt, std::string* holder);

 private:
  std::optional<ckpt::RecordWatch> record_;  // none without a checkpoint directory
};

// CHECKPOINT_DIR/membership-change: present while a stop to change hosts is asked for (the hosts
// that go on then keep the state in memory: train/state/snapshots.hpp). Nothing without a checkpoint dir.
void mark_membership_change(const std::string& checkpoint_dir, bool on);
// This hpcrun's token, random, the same for all its attempts: its ranks get it as HPCRUN_TOKEN.
// It is in that marker ("token=T"), and hpctrain obeys a marker of its own hpcrun only
// (ckpt::membership_marker), not one an hpcrun that was killed left behind; hpctrain puts it in
// its heartbeat, with the attempt (HeartbeatWatch).
const std::string& hpcrun_token();

}  // namespace hpc::launch

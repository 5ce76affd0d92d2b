#include "attempt.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/duration.hpp"
#include "core/exit_codes.hpp"

namespace hpc::launch {
namespace fs = std::filesystem;

namespace {

// Variables every rank needs from hpcrun's environment (Open MPI forwards none by itself).
bool forwarded(const std::string& name) {
  if (name == "PATH" || name == "LD_LIBRARY_PATH") return true;
  for (const char* prefix : {"HPCTRAIN_", "HPCRUN_", "NCCL_", "OMP_", "FI_"})
    if (name.rfind(prefix, 0) == 0) return true;
  return false;
}

std::string joined(const std::vector<std::string>& words) {
  std::string out;
  for (const std::string& w : words) out += (out.empty() ? "" : " ") + w;
  return out;
}

// The command as the attempt's log records it: the values given with -x NAME=VALUE (here or in
// --mpi-args: tokens, keys) left out, as NAME=(not logged). The log lies beside the checkpoints,
// often on storage that others can read; the ranks still get the values.
std::string logged_command(std::vector<std::string> cmd) {
  for (size_t i = 1; i < cmd.size(); ++i)
    if (const size_t eq = cmd[i].find('='); cmd[i - 1] == "-x" && eq != std::string::npos)
      cmd[i] = cmd[i].substr(0, eq) + "=(not logged)";
  return joined(cmd);
}

// "[a2:r3] " before rank 3's lines in attempt 2, "[a2:mpirun] " before mpirun's own.
std::string line_prefix(int attempt, int rank) {
  std::ostringstream os;
  os << "[a" << attempt << ':';
  if (rank >= 0) os << 'r' << rank;
  else os << "mpirun";
  os << "] ";
  return os.str();
}

}  // namespace

std::vector<std::string> mpirun_running(const LaunchOptions& o, const HostList& placement,
                                        const std::vector<std::string>& program) {
  std::vector<std::string> cmd = {o.mpirun, "-np", std::to_string(total_slots(placement)), "-H", show_hosts(placement)};
  if (::geteuid() == 0) cmd.push_back("--allow-run-as-root");
  // Open MPI's daemons send the signals mpirun forwards (SIGUSR1, SIGUSR2) to a rank's whole
  // process group: the program as well as the wrapper, so hpcrun's liveness query (SIGUSR2) killed
  // it. To the wrapper alone, which answers the query and passes the rest on. (A teardown's
  // SIGTERM and SIGKILL still go to the group.)
  cmd.insert(cmd.end(), {"--mca", "odls_base_signal_direct_children_only", "1"});
  const bool remote = std::any_of(placement.begin(), placement.end(), [](const Host& h) { return !is_local_host(h.name); });
  if (remote && (o.host_source != HostSource::Slurm || o.launch_agent_given)) {
    cmd.insert(cmd.end(), {"--mca", "plm_rsh_agent", joined(agent_command(o))});
  } else if (o.host_source == HostSource::Slurm) {
    // mpirun starts its daemons with srun, which without a node list takes the whole
    // allocation, a lost node included, and waits for that node forever; and a step of the
    // failed attempt that Slurm cannot end on the lost node keeps its CPUs on the others
    // (--no-kill), which the next step must share.
    std::string names;
    for (const Host& h : placement) names += (names.empty() ? "" : ",") + h.name;
    cmd.insert(cmd.end(), {"--mca", "plm_slurm_args",
                           "--overlap --nodes=" + std::to_string(placement.size()) + " --nodelist=" + names});
  }
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const std::string name = kv.substr(0, kv.find('='));
    if (forwarded(name)) cmd.insert(cmd.end(), {"-x", name});
  }
  for (const std::string& e : o.env) cmd.insert(cmd.end(), {"-x", e});
  cmd.insert(cmd.end(), o.mpi_args.begin(), o.mpi_args.end());
  cmd.insert(cmd.end(), program.begin(), program.end());
  return cmd;
}

std::vector<std::string> mpirun_command(const LaunchOptions& o, const HostList& placement,
                                        const std::string& self_exe) {
  std::vector<std::string> program = {self_exe, "--rank-exec"};
  program.insert(program.end(), o.program.begin(), o.program.end());
  std::vector<std::string> cmd = mpirun_running(o, placement, program);
  // --display-map: where mpirun put each rank (analysis.hpp's ProcessMap), not where hpcrun
  // expects it to.
  cmd.insert(cmd.begin() + 1, {"--tag-output", "--display-map"});
  return cmd;
}

AttemptWatcher::AttemptWatcher(const JobContext& job, int number, int restarts, const HostList& placement)
    : job_(job),
      o_(job.o),
      restarts_(restarts),
      placement_(placement),
      phase_(PhaseTimeouts{job.heartbeat.enabled(), job.o.stall_timeout, job.o.stop_timeout, job.o.teardown_timeout,
                           job.o.start_timeout},
             job.clock.now()),
      lock_(job.o.checkpoint_dir) {
  rec_.number = number;
  rec_.hosts = placement;
  rec_.np = total_slots(placement);
  rec_.start = now();
}

AttemptRecord AttemptWatcher::run() {
  start();
  ExitStatus status;
  while (mpirun_.out_fd() >= 0 || mpirun_.err_fd() >= 0 || !phase_.mpirun_gone()) {
    read_output();
    const double t = now();
    check_exit(t, &status);
    if (!phase_.mpirun_gone()) {
      take_signals(t);
      watch_heartbeat(t);
      deliver_stop(t);
    }
    escalate(t);
    watch_membership(t);
  }
  return conclude(status);
}

void AttemptWatcher::set_env() {
  ::setenv("HPCRUN_ATTEMPT", std::to_string(rec_.number).c_str(), 1);
  ::setenv("HPCRUN_RESTART_COUNT", std::to_string(restarts_).c_str(), 1);
  ::setenv("HPCRUN_TOKEN", hpcrun_token().c_str(), 1);
  // hpcrun's umask, for the ranks (rank_exec_main sets it): a rank that sshd started took sshd's
  // (022), and made the checkpoints of a job run under `umask 077` readable by every user.
  const mode_t mask = ::umask(0);
  ::umask(mask);
  char octal[8];
  std::snprintf(octal, sizeof octal, "%04o", static_cast<unsigned>(mask));
  ::setenv("HPCRUN_UMASK", octal, 1);
  if (o_.host_source == HostSource::Slurm && !o_.launch_agent_given) {
    for (const auto& [name, value] : slurm_allocation_env(placement_)) ::setenv(name.c_str(), value.c_str(), 1);
  }
}

void AttemptWatcher::start() {
  std::string log_path;
  rec_.number = job_.voice.open_attempt_log(o_.log_dir, rec_.number, &log_path);
  if (!job_.voice.attempt_log_open()) say("warning: cannot write " + log_path);
  set_env();
  const std::vector<std::string> cmd = mpirun_command(o_, placement_, job_.self_exe);
  say("attempt " + std::to_string(rec_.number) + ": " + std::to_string(rec_.np) + " rank(s) on " +
      show_hosts(placement_) + " (log " + log_path + ")");
  job_.voice.log_line("hpcrun: " + logged_command(cmd));

  job_.heartbeat.begin(now(), rec_.number);
  mark_membership_change(o_.checkpoint_dir, false);
  mpirun_ = Child::spawn(cmd, SpawnOptions{});
  last_membership_ = now();
}

AttemptRecord AttemptWatcher::conclude(const ExitStatus& status) {
  mpirun_.signal(SIGKILL);  // whatever mpirun left in its process group (launch agents)
  rec_.end = now();
  job_.voice.attempt_log() << "hpcrun: mpirun ended with " << status.show() << '\n';

  evidence_.mpirun_status = status;
  evidence_.stop_requested = stop_.kind != StopKind::None;
  if (!stop_.leaving.empty()) evidence_.leaving.insert(stop_.leaving);
  evidence_.stalled = phase_.stalled();
  evidence_.stalled_starting = phase_.stalled_starting() && o_.start_timeout_given;
  if (!evidence_.reports.empty() || !process_map_.node_of_rank().empty()) place_ranks_once();
  Analysis an = analyse_attempt(placement_, evidence_);
  if (an.verdict == Verdict::Failure && an.failed_hosts.empty() && evidence_.daemons_not_started) find_daemonless(&an);
  rec_.verdict = an.verdict;
  rec_.membership = stop_.kind == StopKind::Membership && an.verdict == Verdict::Stopped;
  rec_.failed_hosts.assign(an.failed_hosts.begin(), an.failed_hosts.end());
  rec_.program_error = an.program_error;
  rec_.killed_on_request = evidence_.killed_on_request;
  rec_.outcome = an.verdict == Verdict::Stopped && rec_.membership ? "stopped to change hosts: " + stop_.why : an.reason;
  if (an.verdict != Verdict::Failure) rec_.failed_at = -1;
  else if (rec_.failed_at < 0) rec_.failed_at = rec_.end;
  return rec_;
}

// mpirun could not start its daemon on some host, and named none: ssh reached it (its health probe
// passed) but Open MPI's orted did not run there (not installed, a library missing, /tmp full) or
// could not call back. Every attempt on the same hosts would fail the same way. Each remote host
// is asked to start one alone, by the same mpirun command with `true` for the program, at once,
// within --probe-timeout; those that cannot are blamed. (This machine needs no daemon: mpirun is
// its own.)
void AttemptWatcher::find_daemonless(Analysis* an) {
  std::vector<std::string> remote;
  for (const Host& h : placement_)
    if (!is_local_host(h.name)) remote.push_back(h.name);
  if (remote.empty()) return;
  say("mpirun could not start its daemon on a host it did not name: each of " + listed(remote) +
      " is asked to start one alone");
  std::vector<std::vector<std::string>> commands;
  for (const std::string& h : remote) commands.push_back(mpirun_running(o_, {{h, 1}}, {"true"}));
  const std::vector<CommandResult> results = run_commands(commands, o_.probe_timeout);
  std::vector<std::string> failed;
  for (size_t i = 0; i < remote.size(); ++i) {
    const CommandResult& r = results[i];
    job_.voice.log_line("hpcrun: " + logged_command(commands[i]) + ": " + (r.ok() ? "ok" : r.why()));
    if (r.ok()) continue;
    failed.push_back(remote[i]);
    say("host " + remote[i] + " cannot start mpirun's daemon (" +
        (!r.started || r.timed_out ? r.why() : r.status.show() + ": " + first_said(r.output)) + ")");
  }
  if (failed.empty()) {
    an->reason += " (mpirun could not start a daemon; each host started one alone after it)";
    return;
  }
  an->failed_hosts.insert(failed.begin(), failed.end());
  an->reason = "mpirun could not start its daemon on " + listed(failed);
}

// ----------------------------------------------------------------------- the watch loop's steps

void AttemptWatcher::read_output() {
  // Signals wake the loop while mpirun runs; once it is gone they wait for the supervisor (a
  // waiting one woke the poll at once, and the loop spun until the pipes closed).
  std::vector<pollfd> fds;
  if (mpirun_.out_fd() >= 0) fds.push_back({mpirun_.out_fd(), POLLIN, 0});
  if (mpirun_.err_fd() >= 0) fds.push_back({mpirun_.err_fd(), POLLIN, 0});
  const size_t streams = fds.size();
  if (!phase_.mpirun_gone()) fds.push_back({job_.signals.fd(), POLLIN, 0});
  ::poll(fds.data(), fds.size(), 100);
  for (size_t k = 0; k < streams; ++k)
    if (fds[k].revents & (POLLIN | POLLHUP | POLLERR)) read_stream(fds[k].fd);
}

void AttemptWatcher::read_stream(int fd) {
  const bool is_err = fd == mpirun_.err_fd();
  LineSplitter& splitter = is_err ? err_lines_ : out_lines_;
  std::vector<std::string> lines;
  const bool open = splitter.read_from(fd, &lines);
  for (const std::string& l : lines)
    for (const std::string& piece : split_rank_line(l)) handle_output(piece, is_err);
  if (open) return;
  std::string rest;
  if (splitter.take_rest(&rest))
    for (const std::string& piece : split_rank_line(rest)) handle_output(piece, is_err);
  if (is_err) mpirun_.close_err();
  else mpirun_.close_out();
}

void AttemptWatcher::check_exit(double t, ExitStatus* status) {
  if (phase_.mpirun_gone() || !mpirun_.poll(status)) return;
  if (rec_.failed_at < 0 && !status->success()) rec_.failed_at = t;
  // The beats written since the last poll (at most 0.1 s ago, far more on a loaded machine): the
  // last step of a job that ended, which its summary reports and a relaunch counts from.
  record_beat(t);
  // Launch agents mpirun started may hold its pipes open after it is gone.
  phase_.exited(t);
}

// Signals to hpcrun: the first asks for a checkpoint-and-stop, a second kills the job.
void AttemptWatcher::take_signals(double t) {
  int sig;
  while (job_.signals.take(&sig)) {
    if (job_.signals.taken() == 1 && stop_.kind != StopKind::User) {
      // A user's stop outranks one to grow or drain, and is for good (a requeue may run on other
      // nodes): ranks that have not yet looked at the marker write a checkpoint, not snapshots alone.
      if (stop_.kind == StopKind::Membership) mark_membership_change(o_.checkpoint_dir, false);
      stop_ = {};
      request_stop(StopKind::User, std::string("hpcrun got ") + ::strsignal(sig) + " (a second one kills the job)");
    } else if (phase_.kill_requested(t) == Action::Terminate) {
      say(std::string("got ") + ::strsignal(sig) + " again: killing the job without a checkpoint");
      evidence_.killed_on_request = true;
      mpirun_.signal(SIGTERM);
    }
  }
}

// A stop reaches the ranks through mpirun, which passes SIGUSR1 on. While mpirun has no handler
// for it yet (its first moments), the signal would end it instead: it waits. And mpirun drops
// one that comes while it starts the ranks (measured: a Ctrl-C 20 ms after the launch, and the
// job ran to its end), so a stop asked for before the first step is asked again once the job
// runs: at its first step, or without a heartbeat once it counts as running. (hpctrain takes a
// second SIGUSR1 for the same stop.)
void AttemptWatcher::deliver_stop(double t) {
  if (!mpirun_.running()) return;
  if (stop_unsent_) {
    if (!catches_signal(mpirun_.pid(), SIGUSR1)) return;
    stop_unsent_ = false;
    ::kill(mpirun_.pid(), SIGUSR1);
  }
  if (!stop_before_running_) return;
  const bool runs = rec_.first_step >= 0 ||
                    (!job_.heartbeat.enabled() && t - rec_.start >= AttemptPhase::kStartupGrace);
  if (!runs) return;
  stop_before_running_ = false;
  job_.voice.log_line("hpcrun: asking again (the job had not started when first asked): " + stop_.why);
  ::kill(mpirun_.pid(), SIGUSR1);
}

void AttemptWatcher::watch_heartbeat(double t) {
  if (t - last_beat_poll_ < 0.1) return;
  last_beat_poll_ = t;
  watch_lock(t);
  if (!record_beat(t)) return;
  if (job_.heartbeat.writing()) return phase_.writing(t);
  phase_.progress(t);
  watch_stragglers(t);
}

// A relaunch after a lost host can find the last attempt's rank 0 still alive there, holding the
// checkpoint directory's lock until its own step watchdog ends it (up to --step-timeout, 10m, after
// its last step); this attempt's rank 0 waits for it (--checkpoint-lock-wait, which hpcrun makes
// that and a minute). --start-timeout (10m) counted that wait: the attempt was killed as a stall
// just as the lock came free, and a failure counted. It counts from the release.
void AttemptWatcher::watch_lock(double t) {
  if (rec_.first_step >= 0 || phase_.phase() != Phase::Starting || t - last_lock_poll_ < 1) return;
  last_lock_poll_ = t;
  std::string holder;
  if (!lock_.held_by_another(t, hpcrun_token(), std::to_string(rec_.number), &holder)) return;
  phase_.start_held(t);
  if (lock_wait_said_) return;
  lock_wait_said_ = true;
  say("attempt " + std::to_string(rec_.number) + " waits for the checkpoint directory's lock, held by " + holder +
      "; its --start-timeout counts from the release");
}

bool AttemptWatcher::record_beat(double t) {
  if (!job_.heartbeat.poll(t)) return false;
  // A beat of a checkpoint's write that moves (hpctrain's Heartbeat::writing): the job is alive but
  // took no step, which the attempt's step times must not count (AttemptPhase::writing).
  if (job_.heartbeat.writing()) return true;
  if (rec_.first_step < 0) {
    rec_.first_step = job_.heartbeat.step();
    rec_.first_step_at = t;
    const std::string from = job_.heartbeat.field("resumed_from");
    rec_.resumed_source = job_.heartbeat.field("resumed_source");
    if (!from.empty()) rec_.resumed_from = std::atoll(from.c_str());
    job_.voice.log_line("hpcrun: first step of attempt " + std::to_string(rec_.number) + ": global step " +
             std::to_string(rec_.first_step) +
             (rec_.resumed_source.empty() ? ""
              : rec_.started_afresh()     ? " (started afresh)"
                                          : " (resumed from: " + rec_.resumed_source + ", step " + from + ")"));
  }
  rec_.last_step = job_.heartbeat.step();
  rec_.last_step_at = t;
  return true;
}

// The heartbeat names the slowest rank (hpctrain's figures over its last seconds); hpcrun knows
// that rank's host by its own name for it (the one it blacklists) from mpirun's process map.
void AttemptWatcher::watch_stragglers(double t) {
  place_ranks_once();  // the ranks have stepped: the map, if mpirun printed one, is whole
  const std::vector<std::string>& hosts = evidence_.rank_hosts;
  const std::string rank = job_.heartbeat.field("slowest_rank"), ratio = job_.heartbeat.field("straggler_ratio");
  StragglerSighting seen;
  const int r = std::atoi(rank.c_str());
  if (!rank.empty() && !ratio.empty() && r >= 0 && r < static_cast<int>(hosts.size()))
    seen = {hosts[static_cast<size_t>(r)], std::atof(ratio.c_str())};
  const bool can_drain = stop_.kind == StopKind::None && phase_.running() && job_.hosts.enough_slots_without(seen.host);
  const StragglerDecision d = judge_straggler(straggler_, seen, t, o_.stragglers, can_drain);
  straggler_ = d.next;
  if (d.action == StragglerAction::None) return;
  // The trainer's name for the host too, where it is not hpcrun's (an address given to -H).
  const std::string own_name = job_.heartbeat.field("slowest_host");
  char times[96];
  std::snprintf(times, sizeof times, "%.1fx the median for %s (--straggler-factor %g", seen.ratio,
                show_duration(std::round(d.held_seconds)).c_str(), o_.stragglers.factor);
  const std::string line = "host " + seen.host + (own_name.empty() || own_name == seen.host ? "" : " (" + own_name + ")") +
                           " is a straggler: its rank " + std::to_string(r) + "'s steps take " + times +
                           ", --straggler-time " +
                           show_duration(o_.stragglers.seconds) + ")";
  if (d.action == StragglerAction::Name) return say(line);
  if (d.action == StragglerAction::NameNotDrained)
    return say(line + "; not drained: " +
               (stop_.kind != StopKind::None || !phase_.running()
                    ? std::string("the job is stopping already")
                    : "without it the hosts have fewer than --min-np " + std::to_string(o_.min_np) + " slots"));
  say(line);
  job_.hosts.served(seen.host, rec_.start, t);  // slow, but it did not fail: its time so far counts
  const double cooldown = job_.hosts.blacklist(seen.host, t);
  request_stop(StopKind::Membership,
               "draining straggler host " + seen.host + ", kept out for " + show_duration(cooldown), seen.host);
}

void AttemptWatcher::escalate(double t) {
  const Escalation e = phase_.escalate(t);
  switch (e.action) {
    case Action::None: return;
    case Action::QueryLiveness:
      if (e.from == Phase::Starting && o_.start_timeout_given)
        say("no first step within " + show_duration(o_.start_timeout) + " of the launch (--start-timeout, heartbeat in " +
            o_.checkpoint_dir + "): asking which ranks respond, then killing the job");
      else
        say("no step finished for " + show_duration(o_.stall_timeout) + " (--stall-timeout, heartbeat in " +
            o_.checkpoint_dir + "): asking which ranks respond, then killing the job");
      rec_.failed_at = t;
      ::kill(mpirun_.pid(), SIGUSR2);  // mpirun forwards it to every rank's wrapper, which answers
      return;
    case Action::Terminate:
      if (e.from == Phase::Stopping)
        say("the job did not stop within --stop-timeout " + show_duration(o_.stop_timeout) + "; killing it");
      mpirun_.signal(SIGTERM);
      return;
    case Action::Kill:
      if (e.from == Phase::TearingDown)
        say("mpirun did not end the failed job within --teardown-timeout " + show_duration(o_.teardown_timeout) +
            " (a host unreachable?); killing it");
      mpirun_.signal(SIGKILL);
      return;
    case Action::CloseOutput:
      mpirun_.signal(SIGKILL);
      mpirun_.close_out();
      mpirun_.close_err();
      return;
  }
}

// Growth and draining: only while the job runs undisturbed (a stop request while mpirun is still
// starting the job is lost), every --discovery-interval.
void AttemptWatcher::watch_membership(double t) {
  if (!phase_.running() || t - last_membership_ < o_.discovery_interval) return;
  check_membership();
  last_membership_ = now();  // from the end: the discovery script and the probes take time of their own
}

// A host that left the discovery output drains the job off it, and one whose slots there fell below
// its ranks drains the job off those (Horovod's elastic driver does the same: else the ranks ran on
// slots given to others, a GPU or a core taken back); healthy hosts that are not in it yet, and
// slots added to a host in it, grow it (up to --max-np).
void AttemptWatcher::check_membership() {
  const HostList known = job_.hosts.known_hosts();
  if (o_.host_source == HostSource::Discovery) {
    for (const Host& h : placement_) {
      const Host* now = find_host(known, h.name);
      if (!now)
        return request_stop(StopKind::Membership, "host " + h.name + " left the discovery output (draining it)", h.name);
      if (now->slots < h.slots)
        return request_stop(StopKind::Membership, "host " + h.name + " has " + std::to_string(now->slots) +
                                                      " slot(s) in the discovery output, fewer than its " +
                                                      std::to_string(h.slots) + " rank(s) (draining it to them)");
    }
  }
  const int np = total_slots(placement_);
  if (o_.max_np && np >= o_.max_np) return;
  const std::string joining = job_.hosts.joining_hosts(placement_, known);
  if (!joining.empty()) return request_stop(StopKind::Membership, "growing onto " + joining);
  // A host whose slots rose (hostA:2, then hostA:4) grows the job as a new host would; Horovod's
  // elastic driver counts such a host as added too. By as many as the job takes: up to --max-np.
  for (const Host& h : placement_)
    if (const Host* now = find_host(known, h.name); now && now->slots > h.slots) {
      const int more = o_.max_np ? std::min(now->slots - h.slots, o_.max_np - np) : now->slots - h.slots;
      return request_stop(StopKind::Membership,
                          "growing onto " + std::to_string(more) + " more slot(s) of host " + h.name);
    }
}

// ---------------------------------------------------------------------------------- output

// The first sign of a failure (a rank that failed, a host mpirun names) starts the clock on
// mpirun's teardown of the rest.
void AttemptWatcher::note_failure() {
  if (rec_.failed_at < 0) rec_.failed_at = now();
  phase_.failure_seen(now());
}

void AttemptWatcher::handle_output(const std::string& line, bool from_stderr) {
  const TaggedLine t = parse_tagged(line, from_stderr);
  const std::string prefix = line_prefix(rec_.number, t.rank);
  job_.voice.log_line(prefix + t.text);
  if (t.rank < 0 && !t.is_stderr && take_map_line(t.text)) return;
  AttemptEvidence& ev = evidence_;
  RankReport report;
  int alive_rank = -1;
  // The wrapper's lines are believed only from the rank mpirun tags them with, and only on
  // stderr, where the wrapper writes them: the program shares that stream, and what it prints
  // (a log quoting another rank's status, say) must not speak for another rank.
  const bool from_wrapper = t.rank >= 0 && t.is_stderr;
  if (from_wrapper && parse_report(t.text, &report) && report.rank == t.rank) {
    ev.reports.push_back(report);
    if (failed_by_itself(report) || (report.status.exited && report.status.code == kExitStepTimeout))
      note_failure();
    return;  // the wrapper's lines stay in the log
  }
  if (from_wrapper && parse_alive(t.text, &alive_rank) && alive_rank == t.rank) {
    ev.alive.insert(alive_rank);
    return;
  }
  if (from_wrapper && parse_signalled(t.text, &alive_rank) && alive_rank == t.rank) {
    ev.signalled.insert(alive_rank);
    return;
  }
  if (t.rank >= 0 && t.is_stderr) keep_error_line(ev.error_lines[t.rank], t.text);
  if (const std::string x = t.rank < 0 ? executable_named_by_mpirun(t.text) : ""; !x.empty() && x != job_.self_exe)
    ev.foreign_executable = x;
  if (t.rank < 0 && says_daemons_not_started(t.text)) ev.daemons_not_started = true;
  const std::string blamed = t.rank < 0 ? host_blamed_by_mpirun(t.text) : "";
  if (!blamed.empty()) {
    ev.blamed_by_mpirun.push_back(blamed);
    if (names_a_process_end(t.text)) ev.process_ends_by_mpirun.push_back(blamed);
    note_failure();
  }
  if (keep_off_terminal(t)) return;
  if (!t.is_stderr) {
    job_.voice.relay_output(prefix + t.text);
  } else {
    job_.voice.relay_error(prefix + t.text);
  }
}

// The process map stays in the attempt's log (and on the terminal where --mpi-args asked for one).
bool AttemptWatcher::take_map_line(const std::string& text) {
  const bool ours = process_map_.take(text);
  if (process_map_.complete()) place_ranks_once();
  if (!ours) return false;
  const bool asked = std::any_of(o_.mpi_args.begin(), o_.mpi_args.end(),
                                 [](const std::string& w) { return w.find("-display-") != std::string::npos; });
  if (asked && !o_.quiet) job_.voice.relay_output(line_prefix(rec_.number, -1) + text);
  return true;
}

// Once the first map has ended, or once the ranks have run without one that ended (a devel map
// has no closing rule; a format hpcrun does not know, none it can read).
void AttemptWatcher::place_ranks_once() {
  if (ranks_placed_) return;
  ranks_placed_ = true;
  RankPlacement p = place_ranks(placement_, process_map_.node_of_rank());
  if (!p.problem.empty())
    say("warning: " + p.problem + "; the ranks are taken to be on the hosts in -H's slot order (failures and "
        "stragglers blamed on those)");
  evidence_.rank_hosts = std::move(p.hosts);  // the slot order, where there is a problem
  evidence_.host_of_node = std::move(p.host_of_node);
}

bool AttemptWatcher::keep_off_terminal(const TaggedLine& t) const {
  if (o_.quiet) return true;
  // "Forwarding signal 12 to job": hpcrun has said why it sent one.
  if (t.rank < 0 && t.text.rfind("mpirun: Forwarding signal", 0) == 0) return true;
  // After a rank's usage error, mpirun's account of the abort (a dozen lines) would bury the
  // program's own message: it stays in the attempt's log.
  const std::vector<RankReport>& reports = evidence_.reports;
  return t.rank < 0 && std::any_of(reports.begin(), reports.end(), is_usage_error);
}

void AttemptWatcher::request_stop(StopKind kind, const std::string& why, const std::string& leaving) {
  if (stop_.kind != StopKind::None) return;
  stop_ = {kind, why, leaving};
  stop_before_running_ = rec_.first_step < 0;
  phase_.stop_requested(now());
  // For a change of hosts the hosts that go on keep the state in memory: hpctrain then writes
  // snapshots instead of a checkpoint to shared storage (train/state/snapshots.hpp).
  if (kind == StopKind::Membership) mark_membership_change(o_.checkpoint_dir, true);
  say("asking the job to checkpoint and stop: " + why);
  stop_unsent_ = true;
  deliver_stop(now());
}

}  // namespace hpc::launch

// One attempt: mpirun started on a placement, watched until it and its output are gone, judged.
// The watch loop's state is the attempt's phase (attempt_phase.hpp); each pass reads output,
// notes mpirun's exit, takes hpcrun's signals, reads the heartbeat, escalates a phase whose
// deadline passed, and decides on growth and draining, each in its own step below.
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/duration.hpp"
#include "supervisor.hpp"
#include "train/exit_codes.hpp"

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

std::vector<std::string> Supervisor::mpirun_command(const HostList& placement) const {
  std::vector<std::string> cmd = {o_.mpirun, "--tag-output", "-np", std::to_string(total_slots(placement)), "-H",
                                  show_hosts(placement)};
  if (::geteuid() == 0) cmd.push_back("--allow-run-as-root");
  // Open MPI's daemons send the signals mpirun forwards (SIGUSR1, SIGUSR2) to a rank's whole
  // process group: the program as well as the wrapper, so hpcrun's liveness query (SIGUSR2) killed
  // it. To the wrapper alone, which answers the query and passes the rest on. (A teardown's
  // SIGTERM and SIGKILL still go to the group.)
  cmd.insert(cmd.end(), {"--mca", "odls_base_signal_direct_children_only", "1"});
  const bool remote = std::any_of(placement.begin(), placement.end(), [](const Host& h) { return !is_local_host(h.name); });
  if (remote && (o_.host_source != HostSource::Slurm || o_.launch_agent_given)) {
    cmd.insert(cmd.end(), {"--mca", "plm_rsh_agent", joined(agent_command())});
  } else if (o_.host_source == HostSource::Slurm) {
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
  for (const std::string& e : o_.env) cmd.insert(cmd.end(), {"-x", e});
  cmd.insert(cmd.end(), o_.mpi_args.begin(), o_.mpi_args.end());
  cmd.insert(cmd.end(), {self_exe_, "--rank-exec"});
  cmd.insert(cmd.end(), o_.program.begin(), o_.program.end());
  return cmd;
}

AttemptRecord Supervisor::run_attempt(const HostList& placement) {
  Attempt a = start_attempt(placement);
  ExitStatus status;
  while (a.mpirun.out_fd() >= 0 || a.mpirun.err_fd() >= 0 || !a.phase.mpirun_gone()) {
    read_output(a);
    const double t = now();
    check_exit(a, t, &status);
    if (!a.phase.mpirun_gone()) {
      take_signals(a, t);
      watch_heartbeat(a, t);
    }
    escalate(a, t);
    watch_membership(a, t);
  }
  return conclude(a, status);
}

void Supervisor::set_attempt_env(const Attempt& a) {
  ::setenv("HPCRUN_ATTEMPT", std::to_string(a.rec.number).c_str(), 1);
  ::setenv("HPCRUN_RESTART_COUNT", std::to_string(failures_).c_str(), 1);
  if (o_.host_source == HostSource::Slurm && !o_.launch_agent_given) {
    for (const auto& [name, value] : slurm_allocation_env(a.placement)) ::setenv(name.c_str(), value.c_str(), 1);
  }
}

Supervisor::Attempt Supervisor::start_attempt(const HostList& placement) {
  AttemptRecord rec;
  rec.number = first_attempt_ + static_cast<int>(attempts_.size());
  rec.hosts = placement;
  rec.np = total_slots(placement);
  rec.start = now();
  const PhaseTimeouts timeouts{heartbeat_.enabled(), o_.stall_timeout, o_.stop_timeout, o_.teardown_timeout,
                               o_.start_timeout};
  Attempt a(rec, placement, AttemptPhase(timeouts, rec.start));

  const std::string log_path = (fs::path(o_.log_dir) / ("attempt-" + std::to_string(rec.number) + ".log")).string();
  attempt_log_.close();
  attempt_log_.open(log_path, std::ios::trunc);
  if (!attempt_log_) say("warning: cannot write " + log_path);
  set_attempt_env(a);
  const std::vector<std::string> cmd = mpirun_command(placement);
  say("attempt " + std::to_string(rec.number) + ": " + std::to_string(rec.np) + " rank(s) on " + show_hosts(placement) +
      " (log " + log_path + ")");
  log_line("hpcrun: " + joined(cmd));

  heartbeat_.begin(now());
  mark_membership_change(false);
  a.mpirun = Child::spawn(cmd, SpawnOptions{});
  a.last_membership = now();
  return a;
}

AttemptRecord Supervisor::conclude(Attempt& a, const ExitStatus& status) {
  a.mpirun.signal(SIGKILL);  // whatever mpirun left in its process group (launch agents)
  AttemptRecord& rec = a.rec;
  rec.end = now();
  attempt_log_ << "hpcrun: mpirun ended with " << status.show() << '\n';

  a.evidence.mpirun_status = status;
  a.evidence.stop_requested = a.stop.kind != StopKind::None;
  a.evidence.stalled = a.phase.stalled();
  a.evidence.stalled_starting = a.phase.stalled_starting() && o_.start_timeout_given;
  const Analysis an = analyse_attempt(a.placement, a.evidence);
  rec.verdict = an.verdict;
  rec.membership = a.stop.kind == StopKind::Membership && an.verdict == Verdict::Stopped;
  rec.failed_hosts.assign(an.failed_hosts.begin(), an.failed_hosts.end());
  rec.program_error = an.program_error;
  rec.outcome = an.verdict == Verdict::Stopped && rec.membership ? "stopped to change hosts: " + a.stop.why : an.reason;
  if (an.verdict != Verdict::Failure) rec.failed_at = -1;
  else if (rec.failed_at < 0) rec.failed_at = rec.end;
  return rec;
}

// ----------------------------------------------------------------------- the watch loop's steps

void Supervisor::read_output(Attempt& a) {
  std::vector<pollfd> fds = {{signal_fd(), POLLIN, 0}};
  if (a.mpirun.out_fd() >= 0) fds.push_back({a.mpirun.out_fd(), POLLIN, 0});
  if (a.mpirun.err_fd() >= 0) fds.push_back({a.mpirun.err_fd(), POLLIN, 0});
  ::poll(fds.data(), fds.size(), 100);
  for (size_t k = 1; k < fds.size(); ++k)
    if (fds[k].revents & (POLLIN | POLLHUP | POLLERR)) read_stream(a, fds[k].fd);
}

void Supervisor::read_stream(Attempt& a, int fd) {
  const bool is_err = fd == a.mpirun.err_fd();
  LineSplitter& splitter = is_err ? a.err_lines : a.out_lines;
  std::vector<std::string> lines;
  const bool open = splitter.read_from(fd, &lines);
  for (const std::string& l : lines) handle_output(a, l, is_err);
  if (open) return;
  std::string rest;
  if (splitter.take_rest(&rest)) handle_output(a, rest, is_err);
  if (is_err) a.mpirun.close_err();
  else a.mpirun.close_out();
}

void Supervisor::check_exit(Attempt& a, double t, ExitStatus* status) {
  if (a.phase.mpirun_gone() || !a.mpirun.poll(status)) return;
  if (a.rec.failed_at < 0 && !status->success()) a.rec.failed_at = t;
  // Launch agents mpirun started may hold its pipes open after it is gone.
  a.phase.exited(t);
}

// Signals to hpcrun: the first asks for a checkpoint-and-stop, a second kills the job.
void Supervisor::take_signals(Attempt& a, double t) {
  int sig;
  while (take_signal(&sig)) {
    ++signals_seen_;
    interrupted_ = true;
    if (signals_seen_ == 1 && a.stop.kind != StopKind::User) {
      a.stop = {};  // a user's stop outranks one to grow or drain
      request_stop(a, StopKind::User, std::string("hpcrun got ") + ::strsignal(sig) + " (a second one kills the job)");
    } else if (a.phase.kill_requested(t) == Action::Terminate) {
      say(std::string("got ") + ::strsignal(sig) + " again: killing the job without a checkpoint");
      a.mpirun.signal(SIGTERM);
    }
  }
}

void Supervisor::watch_heartbeat(Attempt& a, double t) {
  if (t - a.last_beat_poll < 0.1) return;
  a.last_beat_poll = t;
  if (!heartbeat_.poll(t)) return;
  AttemptRecord& rec = a.rec;
  if (rec.first_step < 0) {
    rec.first_step = heartbeat_.step();
    rec.first_step_at = t;
    const std::string from = heartbeat_.field("resumed_from");
    rec.resumed_source = heartbeat_.field("resumed_source");
    if (!from.empty()) rec.resumed_from = std::atoll(from.c_str());
    log_line("hpcrun: first step of attempt " + std::to_string(rec.number) + ": global step " +
             std::to_string(rec.first_step) +
             (rec.resumed_source.empty() ? "" : " (resumed from: " + rec.resumed_source + ", step " + from + ")"));
  }
  rec.last_step = heartbeat_.step();
  rec.last_step_at = t;
  a.phase.progress(t);
  watch_stragglers(a, t);
}

// The heartbeat names the slowest rank (hpctrain's figures over its last seconds); hpcrun knows
// that rank's host by its own name for it (the one it blacklists) from the placement.
void Supervisor::watch_stragglers(Attempt& a, double t) {
  const std::vector<std::string> hosts = rank_hosts(a.placement);
  const std::string rank = heartbeat_.field("slowest_rank"), ratio = heartbeat_.field("straggler_ratio");
  StragglerSighting seen;
  if (const int r = std::atoi(rank.c_str()); !rank.empty() && !ratio.empty() && r >= 0 && r < static_cast<int>(hosts.size()))
    seen = {hosts[static_cast<size_t>(r)], std::atof(ratio.c_str())};
  const bool can_drain = a.stop.kind == StopKind::None && a.phase.running() && enough_slots_without(seen.host);
  const StragglerDecision d = judge_straggler(a.straggler, seen, t, o_.stragglers, can_drain);
  a.straggler = d.next;
  if (d.action == StragglerAction::None) return;
  // The trainer's name for the host too, where it is not hpcrun's (an address given to -H).
  const std::string own_name = heartbeat_.field("slowest_host");
  char times[96];
  std::snprintf(times, sizeof times, "%.1fx the median for %s (--straggler-factor %g", seen.ratio,
                show_duration(std::round(d.held_seconds)).c_str(), o_.stragglers.factor);
  const std::string line = "host " + seen.host + (own_name.empty() || own_name == seen.host ? "" : " (" + own_name + ")") +
                           " is a straggler: its steps take " + times + ", --straggler-time " +
                           show_duration(o_.stragglers.seconds) + ")";
  if (d.action == StragglerAction::Name) return say(line);
  if (d.action == StragglerAction::NameNotDrained)
    return say(line + "; not drained: " +
               (a.stop.kind != StopKind::None || !a.phase.running()
                    ? std::string("the job is stopping already")
                    : "without it the hosts have fewer than --min-np " + std::to_string(o_.min_np) + " slots"));
  say(line);
  const double cooldown = blacklist_.fail(seen.host, t);
  request_stop(a, StopKind::Membership,
               "draining straggler host " + seen.host + ", kept out for " + show_duration(cooldown));
}

void Supervisor::escalate(Attempt& a, double t) {
  const Escalation e = a.phase.escalate(t);
  switch (e.action) {
    case Action::None: return;
    case Action::QueryLiveness:
      if (e.from == Phase::Starting && o_.start_timeout_given)
        say("no first step within " + show_duration(o_.start_timeout) + " of the launch (--start-timeout, heartbeat in " +
            o_.checkpoint_dir + "): asking which ranks respond, then killing the job");
      else
        say("no step finished for " + show_duration(o_.stall_timeout) + " (--stall-timeout, heartbeat in " +
            o_.checkpoint_dir + "): asking which ranks respond, then killing the job");
      a.rec.failed_at = t;
      ::kill(a.mpirun.pid(), SIGUSR2);  // mpirun forwards it to every rank's wrapper, which answers
      return;
    case Action::Terminate:
      if (e.from == Phase::Stopping)
        say("the job did not stop within --stop-timeout " + show_duration(o_.stop_timeout) + "; killing it");
      a.mpirun.signal(SIGTERM);
      return;
    case Action::Kill:
      if (e.from == Phase::TearingDown)
        say("mpirun did not end the failed job within --teardown-timeout " + show_duration(o_.teardown_timeout) +
            " (a host unreachable?); killing it");
      a.mpirun.signal(SIGKILL);
      return;
    case Action::CloseOutput:
      a.mpirun.signal(SIGKILL);
      a.mpirun.close_out();
      a.mpirun.close_err();
      return;
  }
}

// Growth and draining: only while the job runs undisturbed (a stop request while mpirun is still
// starting the job is lost), every --discovery-interval.
void Supervisor::watch_membership(Attempt& a, double t) {
  if (!a.phase.running() || t - a.last_membership < o_.discovery_interval) return;
  a.last_membership = t;
  check_membership(a);
}

// ---------------------------------------------------------------------------------- output

// The first sign of a failure (a rank that failed, a host mpirun names) starts the clock on
// mpirun's teardown of the rest.
void Supervisor::note_failure(Attempt& a) {
  if (a.rec.failed_at < 0) a.rec.failed_at = now();
  a.phase.failure_seen(now());
}

void Supervisor::handle_output(Attempt& a, const std::string& line, bool from_stderr) {
  const TaggedLine t = parse_tagged(line, from_stderr);
  const std::string prefix = line_prefix(a.rec.number, t.rank);
  log_line(prefix + t.text);
  AttemptEvidence& ev = a.evidence;
  RankReport report;
  int alive_rank = -1;
  if (t.rank >= 0 && parse_report(t.text, &report)) {
    ev.reports.push_back(report);
    if (failed_by_itself(report) || (report.status.exited && report.status.code == train::kExitStepTimeout))
      note_failure(a);
    return;  // the wrapper's lines stay in the log
  }
  if (t.rank >= 0 && parse_alive(t.text, &alive_rank)) {
    ev.alive.insert(alive_rank);
    return;
  }
  if (t.rank >= 0 && t.is_stderr) keep_error_line(ev.error_lines[t.rank], t.text);
  const std::string blamed = t.rank < 0 ? host_blamed_by_mpirun(t.text) : "";
  if (!blamed.empty()) {
    ev.blamed_by_mpirun.push_back(blamed);
    note_failure(a);
  }
  if (keep_off_terminal(a, t)) return;
  std::FILE* out = t.is_stderr ? stderr : stdout;
  std::fprintf(out, "%s%s\n", prefix.c_str(), t.text.c_str());
  std::fflush(out);
}

bool Supervisor::keep_off_terminal(const Attempt& a, const TaggedLine& t) const {
  if (o_.quiet) return true;
  // "Forwarding signal 12 to job": hpcrun has said why it sent one.
  if (t.rank < 0 && t.text.rfind("mpirun: Forwarding signal", 0) == 0) return true;
  // After a rank's usage error, mpirun's account of the abort (a dozen lines) would bury the
  // program's own message: it stays in the attempt's log.
  const std::vector<RankReport>& reports = a.evidence.reports;
  return t.rank < 0 && std::any_of(reports.begin(), reports.end(), is_usage_error);
}

void Supervisor::mark_membership_change(bool on) const {
  if (o_.checkpoint_dir.empty()) return;
  const fs::path marker = fs::path(o_.checkpoint_dir) / "membership-change";
  std::error_code ec;
  if (!on) {
    fs::remove(marker, ec);
    return;
  }
  std::ofstream(marker) << "hpcrun pid " << ::getpid() << " changes the job's hosts\n";
}

void Supervisor::request_stop(Attempt& a, StopKind kind, const std::string& why) {
  if (a.stop.kind != StopKind::None) return;
  a.stop = {kind, why};
  a.phase.stop_requested(now());
  // For a change of hosts the hosts that go on keep the state in memory: hpctrain then writes
  // snapshots instead of a checkpoint to shared storage (train/snapshots.hpp).
  if (kind == StopKind::Membership) mark_membership_change(true);
  say("asking the job to checkpoint and stop: " + why);
  ::kill(a.mpirun.pid(), SIGUSR1);  // mpirun forwards it to every rank
}

}  // namespace hpc::launch

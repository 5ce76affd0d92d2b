#include "supervisor.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "ckpt/store.hpp"
#include "core/duration.hpp"
#include "core/error.hpp"
#include "core/exit_codes.hpp"
#include "mca.hpp"
#include "relaunch_policy.hpp"
#include "subprocess.hpp"

namespace hpc::launch {
namespace fs = std::filesystem;

namespace {

// The next attempt number: logs of earlier runs in the same directory (a requeued job) are kept.
// Names whose number no run reaches (kMostAttempts) are not logs of ours.
int next_attempt_number(const std::string& dir) {
  int highest = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("attempt-", 0) != 0 || name.size() <= 12 || name.substr(name.size() - 4) != ".log") continue;
    int n = 0;
    const char *first = name.data() + 8, *last = name.data() + name.size() - 4;
    const auto [end, parsed] = std::from_chars(first, last, n);
    if (parsed == std::errc() && end == last && n > 0 && n < kMostAttempts) highest = std::max(highest, n);
  }
  return highest + 1;
}

}  // namespace

// hpctrain given --resume none or --resume FILE begins the run that way in the first attempt; once
// that attempt has trained a step (the new run is under way, its identity and state in the
// directory), a relaunch continues it: --resume auto. Each relaunch had started over, or from
// FILE again, while hpcrun said it continued from the newest saved state. Before a step, the
// next attempt begins as the first was told to.
void Supervisor::resume_auto_after(const AttemptRecord& ended) {
  if (!o_.program_is_hpctrain || ended.first_step < 0) return;
  const std::string given = program_value(o_, "resume");  // (its config file's too)
  if (given.empty() || given == "auto") return;
  set_program_option(o_.program, "resume", "auto");  // (added, where the config file gave it)
  say("the run began with --resume " + given + " in attempt " + std::to_string(ended.number) +
      "; later attempts continue it (--resume auto)");
}

Supervisor::Supervisor(LaunchOptions options)
    : o_(std::move(options)), hosts_(o_, clock_, voice_, signals_), heartbeat_(o_.checkpoint_dir) {
  char exe[PATH_MAX] = {};
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  HPC_CHECK(n > 0, "cannot find hpcrun's own path: ", std::strerror(errno));
  self_exe_ = exe;
}

// Not before the first launch: input refused at once leaves no log directory behind.
void Supervisor::open_logs() {
  if (voice_.opened()) return;
  voice_.open(o_.log_dir);
  first_attempt_ = next_attempt_number(o_.log_dir);
}

// mpirun's own usage errors (a typo in --mpi-args or -x, an option it does not know) are the same
// on every attempt, and its exit code does not tell them from a lost host. Open MPI's
// --do-not-launch parses and maps the job without starting anything: one such run before the first
// launch makes them hpcrun's usage error, quoting mpirun, instead of a retried failure.
void Supervisor::check_mpirun_accepts(const HostList& placement) {
  std::vector<std::string> cmd = mpirun_command(o_, placement, self_exe_);
  cmd.insert(cmd.begin() + 1, "--do-not-launch");
  const CommandResult r = run_command(cmd, o_.probe_timeout);
  if (r.ok()) return;
  if (!r.started || r.timed_out) {
    say("warning: could not check mpirun's arguments (" + r.why() + ")");
    return;
  }
  usage_error("mpirun refused its arguments (", r.status.show(), "; check --mpi-args and -x): ",
              mpirun_complaint(r.output));
}

// Against the ompi_info beside the mpirun used (the same installation). A parameter or component
// that only the hosts' Open MPI has can go as -x OMPI_MCA_NAME=VALUE, which is not checked.
void Supervisor::check_mca_settings() {
  const std::vector<std::pair<std::string, std::string>> settings = mca_settings(o_.mpi_args);
  if (settings.empty()) return;
  std::string why;
  const std::string mpirun = find_program(o_.mpirun, &why);
  CommandResult r;
  if (!mpirun.empty())
    r = run_command({(std::filesystem::path(mpirun).parent_path() / "ompi_info").string(), "--all", "--parsable"},
                    o_.probe_timeout, /*merge_stderr=*/false);
  const McaCatalogue known = parse_ompi_info(r.ok() ? r.output : "");
  if (known.parameters.empty()) {
    say("warning: could not check the MCA settings of --mpi-args (ompi_info beside " + o_.mpirun + ": " +
        (mpirun.empty() ? why : r.ok() ? "it lists no parameters" : r.why()) + ")");
    return;
  }
  for (const auto& [name, value] : settings)
    if (const std::string problem = mca_problem(known, name, value); !problem.empty())
      usage_error("--mpi-args: ", problem);
}

std::string Supervisor::slurm_preemption() const {
  const char* job = std::getenv("SLURM_JOB_ID");
  if (!job || !*job) return "";
  const CommandResult r = run_command({"scontrol", "show", "job", "-o", job}, o_.probe_timeout, /*merge_stderr=*/false);
  return r.ok() ? slurm_preempt_time(r.output) : "";
}

// hpctrain with a checkpoint directory writes a heartbeat from its first step on (an attempt that
// ended before one, a crash at start-up, says nothing of the next), and is never warned about; a
// program that wrote none in a whole attempt will write none in the next either.
void Supervisor::warn_stragglers_unjudged(const AttemptRecord* ended) {
  if (stragglers_warned_ || o_.straggler_option.empty()) return;
  std::string why;
  if (o_.checkpoint_dir.empty())
    why = "there is no checkpoint directory to read one from (give --checkpoint-dir, where the program writes it)";
  else if (ended && ended->first_step < 0 && !o_.program_is_hpctrain)
    why = "attempt " + std::to_string(ended->number) + " ended without one in " +
          (fs::path(o_.checkpoint_dir) / "heartbeat").string() + " (hpctrain writes it; this program did not)";
  else
    return;
  stragglers_warned_ = true;
  say("warning: " + o_.straggler_option + " does nothing here: stragglers are judged from hpctrain's heartbeat, and " +
      why);
}

// What the directory's heartbeat says of the run's snapshots in host memory against its newest
// checkpoint: Past, it trained past that checkpoint, and the snapshots are the only copy of those
// steps (a checkpoint that could not be written: a full file system; a kill between two); Maybe,
// it was ended while training at that step (the heartbeat beats at most once a second, and a
// snapshot taken after its last beat may be newer); else None. *newest: the checkpoint's step (-1
// for none), *beat: the heartbeat's. With `validate`, where the names alone say None or Maybe, the
// newest checkpoint is read through and checked as a resume checks it (ckpt::newest_valid_step:
// its arenas streamed past, not kept): a damaged one there (a resume passes it
// by for an older one) leaves the snapshots the only copy of its steps; one that cannot be read
// at all says Maybe.
namespace {
using Newer = SnapshotsHeld::Newer;
Newer snapshots_newer(const std::string& dir, bool validate, int64_t* newest, int64_t* beat) {
  const std::map<std::string, std::string> fields = ckpt::read_heartbeat(dir);
  *beat = ckpt::heartbeat_step(fields);
  if (*beat < 0) return Newer::None;
  *newest = ckpt::newest_step(dir);
  if (*beat > *newest) return Newer::Past;
  if (validate) {
    try {
      *newest = ckpt::newest_valid_step(dir);
    } catch (const std::exception&) {
      return Newer::Maybe;
    }
    if (*beat > *newest) return Newer::Past;
  }
  const auto state = fields.find("state");
  return state != fields.end() && state->second == "training" ? Newer::Maybe : Newer::None;
}
}  // namespace

// Every host of the job's attempts that still answers, once each, one process there (after a
// success, only those the last attempt left behind: the finished run removed its own on the
// others); those that no longer answer keep what they hold until their age runs out.
HostList Supervisor::answering_hosts(bool after_success) {
  HostList hosts, remote;
  for (const AttemptRecord& a : attempts_)
    for (const Host& h : a.hosts)
      if (!has_host(hosts, h.name) && !(after_success && has_host(attempts_.back().hosts, h.name)))
        hosts.push_back({h.name, 1});
  for (const Host& h : hosts)
    if (!is_local_host(h.name)) remote.push_back(h);
  std::vector<std::vector<std::string>> probes;
  for (const Host& h : remote) probes.push_back(hosts_.probe_command(h.name));
  const std::vector<CommandResult> answers = run_commands(probes, o_.probe_timeout);
  HostList answering;
  for (const Host& h : hosts) {
    const auto at = std::find(remote.begin(), remote.end(), h);
    if (at == remote.end() || answers[static_cast<size_t>(at - remote.begin())].ok()) answering.push_back(h);
  }
  return answering;
}

// `hpctrain COMMAND ARGS...` once on each of `hosts`, through mpirun: its results (stdout) and its
// own warnings and errors (stderr's "hpctrain..." lines, not mpirun's) said.
CommandResult Supervisor::run_on_hosts(const HostList& hosts, const std::vector<std::string>& command, double timeout) {
  // Inside a Slurm job, Open MPI takes the allocation from SLURM_*, which each attempt narrowed to
  // its own hosts: the last one's would leave out the hosts asked of it here, and mpirun refused
  // them. Narrowed to these.
  if (o_.host_source == HostSource::Slurm && !o_.launch_agent_given)
    for (const auto& [name, value] : slurm_allocation_env(hosts)) ::setenv(name.c_str(), value.c_str(), 1);
  std::vector<std::string> program{o_.program.front()};
  program.insert(program.end(), command.begin(), command.end());
  if (const std::string dir = program_value(o_, "snapshot-dir"); !dir.empty())
    program.insert(program.end(), {"--snapshot-dir", dir});
  const CommandResult r = run_command(mpirun_running(o_, hosts, program), timeout, /*merge_stderr=*/false);
  for (const std::string* text : {&r.output, &r.errors}) {
    std::istringstream lines(*text);
    for (std::string line; std::getline(lines, line);)
      if (!line.empty() && (text == &r.output || line.rfind("hpctrain", 0) == 0)) say(line);
  }
  return r;
}

SnapshotsHeld Supervisor::snapshots_held(int code) {
  SnapshotsHeld held;
  if (!o_.program_is_hpctrain || o_.checkpoint_dir.empty() || attempts_.empty() || code == kExitKilled) return held;
  // Read through only where the snapshots would be freed on the names' word: not after a success,
  // nor after a stop, whose snapshots stay (free_snapshots) and whose signal's grace it would spend.
  const bool validate = code != kExitSuccess && code != kExitCheckpointed;
  held.newer = snapshots_newer(o_.checkpoint_dir, validate, &held.newest, &held.beat);
  return held;
}

// A job that ends with steps past its newest checkpoint (failures that spent --max-restarts; a
// stop signal between attempts, after one that changed the hosts, whose state only the hosts'
// snapshots hold): `hpctrain persist-snapshot` writes the newest snapshot of any host that
// answers into the checkpoint directory. A requeue onto other nodes, or a run long after (the
// snapshots last an hour; an idle cluster's nodes are terminated with their memory) then resumes
// from it, not from the older checkpoint. Whether it did its part: the snapshots then hold
// nothing the checkpoints lack.
bool Supervisor::persist_snapshots(int code, const SnapshotsHeld& held) {
  if (!o_.program_is_hpctrain || o_.checkpoint_dir.empty() || attempts_.empty()) return false;
  if (code == kExitSuccess || code == kExitKilled) return false;  // finished; or asked to end now
  if (!fs::exists(fs::path(o_.checkpoint_dir) / "run-id")) return false;  // no snapshots: none kept
  if (held.newer == Newer::None) return true;  // they hold nothing newer
  const int64_t newest = held.newest, beat = held.beat;
  const HostList hosts = answering_hosts(false);
  if (hosts.empty()) return false;
  say("the run's newest state may be a snapshot in host memory, past the newest checkpoint in " + o_.checkpoint_dir +
      " (" + (newest < 0 ? std::string("none") : "step " + std::to_string(newest)) + "; the heartbeat's step " +
      std::to_string(beat) + "): writing the newest there (" + show_hosts(hosts) + ")");
  // A checkpoint to shared storage: seconds for most models, longer for the largest on a slow
  // file system; bounded, since a stop signal's exit waits for it.
  const CommandResult r = run_on_hosts(hosts, {"persist-snapshot", "--checkpoint-dir", o_.checkpoint_dir},
                                       std::max(120.0, 4 * o_.probe_timeout));
  if (!r.ok()) say("warning: the newest snapshot was not written into " + o_.checkpoint_dir + " (" + r.why() + ")");
  const std::string kept = ": kept the snapshot of step ";
  if (const size_t at = r.output.find(kept); r.ok() && at != std::string::npos)
    persisted_step_ = std::atoll(r.output.c_str() + at + kept.size());
  return r.ok();
}

void Supervisor::free_snapshots(int code, bool persisted, const SnapshotsHeld& held) {
  if (!o_.program_is_hpctrain || o_.checkpoint_dir.empty() || attempts_.empty()) return;
  if (code == kExitCheckpointed || code == kExitKilled) return;  // a relaunch may want them; or asked to end now
  const Newer newer = persisted ? Newer::None : held.newer;
  const int64_t newest = held.newest;
  if (newer != Newer::None) {
    say(std::string("keeping the run's snapshots in host memory: they ") +
        (newer == Newer::Past ? "hold" : "may hold") + " steps past the newest checkpoint in " + o_.checkpoint_dir +
        " (" + (newest < 0 ? std::string("none") : "step " + std::to_string(newest)) +
        "); the same command run again within an hour resumes them");
    snapshots_fate_ = "kept";
    return;
  }
  std::ifstream in(fs::path(o_.checkpoint_dir) / "run-id");
  std::string run_id;
  if (!(in >> run_id) || run_id.size() != 16) return;
  const HostList reachable = answering_hosts(code == 0);
  if (reachable.empty()) return;
  say("freeing the run's snapshots in host memory on " + show_hosts(reachable) + " (run " + run_id + ")");
  const CommandResult r =
      run_on_hosts(reachable, {"clean-snapshots", "--run-id", run_id}, std::max(30.0, 2 * o_.probe_timeout));
  if (!r.ok()) say("warning: could not free the run's snapshots (" + r.why() + "); they go after an hour");
  snapshots_fate_ = r.ok() ? "freed" : "kept";
}

// --------------------------------------------------------------------------------- the loop

int Supervisor::run() {
  if (o_.host_source == HostSource::Discovery) hosts_.discover(true);
  if (o_.program_is_hpctrain && o_.checkpoint_dir.empty())
    say("warning: hpctrain runs without --checkpoint-dir: a relaunch starts it over from step 0, and there is no "
        "heartbeat to detect a stall");
  warn_stragglers_unjudged(nullptr);

  HostList usable;
  if (!hosts_.wait_for_hosts(&usable, true))
    return finish(exit_without_hosts(signals_.interrupted()), hosts_.gave_up());
  check_mpirun_accepts(place(usable, hosts_.target_np(usable, true)));
  check_mca_settings();
  if (int sig; signals_.take(&sig)) {  // during those checks: nothing is launched
    say(std::string("stopping on ") + ::strsignal(sig) + " before the first launch");
    return finish(exit_without_hosts(true), "");
  }
  open_logs();
  bool first = true;
  for (;;) {
    const HostList placement =
        place(usable, hosts_.target_np(usable, first), attempts_.empty() ? HostList{} : attempts_.back().hosts);
    first = false;
    const JobContext job{o_, clock_, voice_, signals_, hosts_, heartbeat_, self_exe_};
    // From the last attempt's number on: it may have passed over numbers another hpcrun took.
    const int number = attempts_.empty() ? first_attempt_ : attempts_.back().number + 1;
    attempts_.push_back(AttemptWatcher(job, number, failures_, placement).run());
    const AttemptRecord& rec = attempts_.back();
    say("attempt " + std::to_string(rec.number) + " " +
        (rec.verdict == Verdict::Success ? "succeeded" : rec.verdict == Verdict::Failure ? "failed" : "ended") + " after " +
        show_duration(rec.end - rec.start) + ": " + rec.outcome);
    warn_stragglers_unjudged(&rec);
    resume_auto_after(rec);
    // A signal that came after mpirun ended (its launch agents' last output, the probes): the job
    // stops here. It waited in the pipe, and a failed attempt was relaunched.
    for (int sig; signals_.take(&sig);)
      say(std::string("got ") + ::strsignal(sig) + " as the attempt ended: nothing more is launched");
    AttemptFacts facts{rec.verdict, rec.membership, signals_.interrupted(), rec.killed_on_request, rec.outcome,
                       rec.program_error, rec.failed_hosts, ""};
    if (asks_slurm(rec.verdict, signals_.interrupted())) facts.preempted_at = slurm_preemption();
    const Decision d = decide_after_attempt(facts, failures_, o_.max_restarts);
    if (d.failure) ++failures_;
    // Every host ran until the attempt failed or ended, the failed ones too: a host that served
    // long since its last failure starts its count over before this one is counted.
    for (const Host& h : rec.hosts) hosts_.served(h.name, rec.start, rec.failed_at >= 0 ? rec.failed_at : rec.end);
    for (const std::string& h : d.blacklist) {
      const double cooldown = hosts_.blacklist(h, now());
      say("host " + h + " blacklisted for " + show_duration(cooldown) + " (failure " +
          std::to_string(hosts_.failures(h)) + " of this host)");
    }
    if (d.next == Next::Finish) return finish(d.exit_code, d.last_line);
    if (!d.relaunch_line.empty()) say(d.relaunch_line);
    if (!hosts_.wait_for_hosts(&usable, false))
      return finish(exit_without_hosts(signals_.interrupted()), hosts_.gave_up());
  }
}

}  // namespace hpc::launch

#include "supervisor.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "ckpt/store.hpp"
#include "core/duration.hpp"
#include "core/error.hpp"
#include "mca.hpp"
#include "subprocess.hpp"
#include "train/exit_codes.hpp"

namespace hpc::launch {
namespace fs = std::filesystem;

namespace {

// hpcrun's exit codes (README, "hpcrun"): a contract with batch scripts.
constexpr int kExitGaveUp = 1;
constexpr int kExitUsage = train::kExitUsage;
constexpr int kExitStopped = train::kExitCheckpointed;  // "stopped after a checkpoint: run me again"
constexpr int kExitKilled = 130;                        // a second signal: killed without a checkpoint

int g_signal_pipe[2] = {-1, -1};

void on_signal(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  [[maybe_unused]] ssize_t n = ::write(g_signal_pipe[1], &b, 1);
  errno = saved;
}

std::string timestamp() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", std::localtime(&t));
  return buf;
}

bool contains(const HostList& hosts, const std::string& name) {
  return std::any_of(hosts.begin(), hosts.end(), [&](const Host& h) { return h.name == name; });
}

// The next attempt number: logs of earlier runs in the same directory (a requeued job) are kept.
int next_attempt_number(const std::string& dir) {
  int highest = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("attempt-", 0) == 0 && name.size() > 12 && name.substr(name.size() - 4) == ".log")
      highest = std::max(highest, std::atoi(name.substr(8).c_str()));
  }
  return highest + 1;
}

}  // namespace

void HeartbeatWatch::begin(double now) {
  if (!enabled()) return;
  last_ = ckpt::read_heartbeat(dir_);
  last_change_ = now;
  step_ = -1;
  seen_ = false;
}

bool HeartbeatWatch::poll(double now) {
  if (!enabled()) return false;
  std::map<std::string, std::string> beat = ckpt::read_heartbeat(dir_);
  if (beat.empty() || beat == last_ || !beat.count("step")) return false;
  last_ = std::move(beat);
  last_change_ = now;
  step_ = std::atoll(last_["step"].c_str());
  seen_ = true;
  return true;
}

std::string HeartbeatWatch::field(const std::string& key) const {
  const auto it = last_.find(key);
  return it == last_.end() ? "" : it->second;
}

Supervisor::Supervisor(LaunchOptions options)
    : o_(std::move(options)),
      blacklist_(o_.cooldown_min, o_.cooldown_max),
      heartbeat_(o_.checkpoint_dir) {
  started_ = monotonic_seconds();
  started_unix_ = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  char exe[PATH_MAX] = {};
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  HPC_CHECK(n > 0, "cannot find hpcrun's own path: ", std::strerror(errno));
  self_exe_ = exe;

  HPC_CHECK(::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) == 0, "pipe: ", std::strerror(errno));
  struct sigaction sa{};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGUSR1}) ::sigaction(s, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
}

Supervisor::~Supervisor() {
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGUSR1}) ::signal(s, SIG_DFL);
  for (int& fd : g_signal_pipe) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
}

double Supervisor::now() const { return monotonic_seconds() - started_; }

// Not before the first launch: input refused at once leaves no log directory behind. What was
// said until then goes into hpcrun.log first.
void Supervisor::open_logs() {
  if (hpcrun_log_.is_open()) return;
  std::error_code ec;
  fs::create_directories(o_.log_dir, ec);
  HPC_REQUIRE(!ec, "--log-dir ", o_.log_dir, ": cannot create it: ", ec.message());
  hpcrun_log_.open((fs::path(o_.log_dir) / "hpcrun.log").string(), std::ios::app);
  HPC_REQUIRE(hpcrun_log_.good(), "--log-dir ", o_.log_dir, ": cannot write in it");
  for (const std::string& line : early_lines_) hpcrun_log_ << line << '\n';
  hpcrun_log_ << std::flush;
  early_lines_.clear();
  first_attempt_ = next_attempt_number(o_.log_dir);
}

void Supervisor::log_line(const std::string& line) {
  if (attempt_log_.is_open()) attempt_log_ << line << '\n' << std::flush;
}

void Supervisor::say(const std::string& line) {
  std::fprintf(stderr, "hpcrun: %s\n", line.c_str());
  std::fflush(stderr);
  if (hpcrun_log_.is_open()) hpcrun_log_ << timestamp() << " " << line << '\n' << std::flush;
  else early_lines_.push_back(timestamp() + " " + line);
  log_line("hpcrun: " + line);
}

int Supervisor::signal_fd() const { return g_signal_pipe[0]; }

bool Supervisor::take_signal(int* sig) {
  unsigned char b = 0;
  if (::read(g_signal_pipe[0], &b, 1) != 1) return false;
  *sig = b;
  return true;
}

// ---------------------------------------------------------------------------------- hosts

bool Supervisor::discover(bool first) {
  last_discovery_ = now();
  const CommandResult r = run_command({o_.discovery_script}, o_.probe_timeout, /*merge_stderr=*/false);
  if (!r.ok()) {
    const std::string msg = "host discovery script " + o_.discovery_script + " failed: " + r.why();
    if (first) usage_error(msg);
    say("warning: " + msg + "; keeping its previous answer");
    return false;
  }
  try {
    discovered_ = parse_discovery_output(r.output, o_.slots_per_host, "host discovery script " + o_.discovery_script);
  } catch (const Error& e) {
    if (first) throw;
    say(std::string("warning: ") + e.what() + "; keeping its previous answer");
    return false;
  }
  return true;
}

HostList Supervisor::known_hosts() {
  if (o_.host_source != HostSource::Discovery) return o_.static_hosts;
  if (now() - last_discovery_ >= o_.discovery_interval) discover(false);
  return discovered_;
}

// For ssh: never a password or host-key prompt (nobody would answer it, and the probe or mpirun's
// start-up would wait for it), and no connection attempt longer than a probe may take: a host that
// does not answer would otherwise hold a probe, or mpirun's start-up, for ssh's default, the
// system's TCP connect timeout (two minutes). On the command line these outrank the user's config.
std::vector<std::string> Supervisor::agent_command() const {
  std::vector<std::string> cmd;
  std::stringstream words(o_.launch_agent);
  for (std::string w; words >> w;) cmd.push_back(w);
  if (fs::path(cmd[0]).filename() == "ssh") {
    const int connect = std::max(1, static_cast<int>(o_.probe_timeout));
    cmd.insert(cmd.begin() + 1, {"-o", "BatchMode=yes", "-o", "ConnectTimeout=" + std::to_string(connect)});
  }
  return cmd;
}

std::vector<std::string> Supervisor::probe_command(const std::string& host) const {
  if (o_.host_source == HostSource::Slurm && !o_.launch_agent_given)
    return {"srun", "--overlap", "--nodes=1", "--ntasks=1", "--nodelist=" + host, "true"};
  std::vector<std::string> cmd = agent_command();
  cmd.push_back(host);
  cmd.push_back("true");
  return cmd;
}

HostList Supervisor::healthy(const HostList& candidates) {
  HostList out, to_probe;
  const double t = now();
  for (const Host& h : candidates) {
    if (blacklist_.blocked(h.name, t)) continue;
    if (is_local_host(h.name)) out.push_back(h);
    else to_probe.push_back(h);
  }
  if (to_probe.empty()) return out;
  std::vector<std::vector<std::string>> commands;
  for (const Host& h : to_probe) commands.push_back(probe_command(h.name));
  const std::vector<CommandResult> results = run_commands(commands, o_.probe_timeout);
  for (size_t i = 0; i < to_probe.size(); ++i) {
    if (results[i].ok()) {
      out.push_back(to_probe[i]);
    } else {
      const double cooldown = blacklist_.fail(to_probe[i].name, now());
      say("host " + to_probe[i].name + " failed its health probe (" + results[i].why() + "); blacklisted for " +
          show_duration(cooldown));
    }
  }
  // Keep the order the hosts were given in: rank 0 stays on the first healthy one.
  HostList ordered;
  for (const Host& h : candidates)
    if (contains(out, h.name)) ordered.push_back(h);
  return ordered;
}

int Supervisor::target_np(const HostList& usable, bool first) const {
  int np = total_slots(usable);
  if (o_.max_np) np = std::min(np, o_.max_np);
  if (first && o_.np) np = std::min(np, o_.np);
  return np;
}

HostList Supervisor::place(const HostList& usable, int np) const {
  HostList placement;
  for (const Host& h : usable) {
    if (np <= 0) break;
    const int take = std::min(h.slots, np);
    placement.push_back({h.name, take});
    np -= take;
  }
  return placement;
}

bool Supervisor::wait_for_hosts(HostList* usable, bool first) {
  const double deadline = now() + o_.elastic_timeout;
  bool announced = false;
  for (;;) {
    *usable = healthy(known_hosts());
    const int slots = total_slots(*usable);
    if (slots >= o_.min_np) return true;
    const std::string have = std::to_string(slots) + " healthy slot(s)" +
                             (usable->empty() ? "" : " (" + show_hosts(*usable) + ")") + ", --min-np " +
                             std::to_string(o_.min_np) + " needed";
    // A fixed host list that cannot start the job at all is bad input, not a reason to wait.
    if (first && o_.host_source != HostSource::Discovery) usage_error("cannot start: ", have);
    if (now() >= deadline) {
      say("gave up: " + have + " after waiting --elastic-timeout " + show_duration(o_.elastic_timeout));
      return false;
    }
    if (!announced) {
      say("waiting up to " + show_duration(o_.elastic_timeout) + " for hosts: " + have);
      announced = true;
    }
    // Until a blacklisted host comes free, the next discovery, or a second, whichever is first.
    const double t = now();
    double until = std::min(t + 1.0, deadline);
    if (blacklist_.next_release(t) > t) until = std::min(until, blacklist_.next_release(t));
    while (now() < until) {
      int sig;
      if (take_signal(&sig)) {
        interrupted_ = true;
        say(std::string("stopping on ") + ::strsignal(sig) + " while waiting for hosts");
        return false;
      }
      ::usleep(50000);
    }
  }
}

// A host that left the discovery output drains the job off it; healthy hosts that are not in it yet
// grow it (up to --max-np).
void Supervisor::check_membership(Attempt& a) {
  const HostList known = known_hosts();
  if (o_.host_source == HostSource::Discovery) {
    for (const Host& h : a.placement)
      if (!contains(known, h.name))
        return request_stop(a, StopKind::Membership, "host " + h.name + " left the discovery output (draining it)");
  }
  const int np = total_slots(a.placement);
  if (o_.max_np && np >= o_.max_np) return;
  const std::string joining = joining_hosts(a.placement, known);
  if (!joining.empty()) request_stop(a, StopKind::Membership, "growing onto " + joining);
}

bool Supervisor::enough_slots_without(const std::string& host) {
  int slots = 0;
  for (const Host& h : known_hosts())
    if (h.name != host && !blacklist_.blocked(h.name, now())) slots += h.slots;
  return slots >= o_.min_np;
}

// The known hosts outside the placement that answer a probe, by name ("" when none).
std::string Supervisor::joining_hosts(const HostList& placement, const HostList& known) {
  HostList candidates;
  for (const Host& h : known)
    if (!contains(placement, h.name) && !blacklist_.blocked(h.name, now())) candidates.push_back(h);
  if (candidates.empty()) return "";
  std::string names;
  for (const Host& h : healthy(candidates)) {
    names += (names.empty() ? "" : ", ") + h.name;
    if (blacklist_.failures(h.name) > 0) say("host " + h.name + " is back after its cooldown");
  }
  return names;
}

// mpirun's own usage errors (a typo in --mpi-args or -x, an option it does not know) are the same
// on every attempt, and its exit code does not tell them from a lost host. Open MPI's
// --do-not-launch parses and maps the job without starting anything: one such run before the first
// launch makes them hpcrun's usage error, quoting mpirun, instead of a retried failure.
void Supervisor::check_mpirun_accepts(const HostList& placement) {
  std::vector<std::string> cmd = mpirun_command(placement);
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

void Supervisor::free_snapshots(int code) {
  if (!o_.program_is_hpctrain || o_.checkpoint_dir.empty() || attempts_.empty()) return;
  if (code == kExitStopped || code == kExitKilled) return;  // a relaunch may want them; or asked to end now
  std::ifstream in(fs::path(o_.checkpoint_dir) / "run-id");
  std::string run_id;
  if (!(in >> run_id) || run_id.size() != 16) return;
  // Every host of the job, once each, one process there (after a success only those the last
  // attempt left behind: the finished run removed its own on the others); those that no longer
  // answer keep theirs until their age runs out (the next run there, the Slurm epilog).
  HostList hosts, remote;
  for (const AttemptRecord& a : attempts_)
    for (const Host& h : a.hosts)
      if (!contains(hosts, h.name) && !(code == 0 && contains(attempts_.back().hosts, h.name)))
        hosts.push_back({h.name, 1});
  if (hosts.empty()) return;
  for (const Host& h : hosts)
    if (!is_local_host(h.name)) remote.push_back(h);
  std::vector<std::vector<std::string>> probes;
  for (const Host& h : remote) probes.push_back(probe_command(h.name));
  const std::vector<CommandResult> answers = run_commands(probes, o_.probe_timeout);
  HostList reachable;
  for (const Host& h : hosts) {
    const auto at = std::find(remote.begin(), remote.end(), h);
    if (at == remote.end() || answers[static_cast<size_t>(at - remote.begin())].ok()) reachable.push_back(h);
  }
  if (reachable.empty()) return;
  std::vector<std::string> cmd = mpirun_command(reachable);
  cmd.erase(std::find(cmd.begin(), cmd.end(), self_exe_), cmd.end());  // the rank wrapper and the program
  cmd.erase(std::remove(cmd.begin(), cmd.end(), std::string("--tag-output")), cmd.end());
  cmd.insert(cmd.end(), {o_.program.front(), "clean-snapshots", "--run-id", run_id});
  if (const std::string dir = program_option(o_.program, "snapshot-dir"); !dir.empty())
    cmd.insert(cmd.end(), {"--snapshot-dir", dir});
  say("freeing the run's snapshots in host memory on " + show_hosts(reachable) + " (run " + run_id + ")");
  const CommandResult r = run_command(cmd, std::max(30.0, 2 * o_.probe_timeout), /*merge_stderr=*/false);
  if (!r.ok()) {
    say("warning: could not free the run's snapshots (" + r.why() + "); they go after an hour");
    return;
  }
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);)
    if (!line.empty()) say(line);
}

// --------------------------------------------------------------------------------- the loop

int Supervisor::run() {
  if (o_.host_source == HostSource::Discovery) discover(true);
  if (o_.program_is_hpctrain && o_.checkpoint_dir.empty())
    say("warning: hpctrain runs without --checkpoint-dir: a relaunch starts it over from step 0, and there is no "
        "heartbeat to detect a stall");

  HostList usable;
  if (!wait_for_hosts(&usable, true)) return finish(interrupted_ ? kExitStopped : kExitGaveUp, "");
  check_mpirun_accepts(place(usable, target_np(usable, true)));
  check_mca_settings();
  open_logs();
  bool first = true;
  for (;;) {
    const HostList placement = place(usable, target_np(usable, first));
    first = false;
    attempts_.push_back(run_attempt(placement));
    const AttemptRecord& rec = attempts_.back();
    say("attempt " + std::to_string(rec.number) + " " +
        (rec.verdict == Verdict::Success ? "succeeded" : rec.verdict == Verdict::Failure ? "failed" : "ended") + " after " +
        show_duration(rec.end - rec.start) + ": " + rec.outcome);
    switch (rec.verdict) {
      case Verdict::Success: return finish(0, "");
      case Verdict::UsageError:
        // Its own words last, where a batch log's reader looks first.
        return finish(kExitUsage, "gave up: " + (rec.program_error.empty() ? rec.outcome
                                                                           : "the program's usage error: " + rec.program_error));
      case Verdict::StoppedOutside: return finish(kExitStopped, "the job stopped itself after a checkpoint; run hpcrun again to resume");
      case Verdict::Stopped:
        if (!rec.membership) return finish(interrupted_ ? kExitStopped : kExitGaveUp, "stopped; run hpcrun again to resume");
        break;
      case Verdict::Failure: {
        if (interrupted_) return finish(kExitKilled, "killed on request");
        // Preemption signals every step of the job, mpirun's daemons too, which end the ranks:
        // it looks like lost hosts, but relaunching inside an allocation Slurm is taking back
        // only races its grace time. 75: the batch script requeues the job, which resumes.
        if (const std::string when = slurm_preemption(); !when.empty())
          return finish(kExitStopped, "Slurm chose this job for preemption at " + when +
                                          " and ended its steps: not a host failure, nothing relaunched; the "
                                          "batch script requeues it (exit 75), and it resumes from the last checkpoint");
        ++failures_;
        for (const std::string& h : rec.failed_hosts) {
          const double cooldown = blacklist_.fail(h, now());
          say("host " + h + " blacklisted for " + show_duration(cooldown) + " (failure " +
              std::to_string(blacklist_.failures(h)) + " of this host)");
        }
        if (failures_ > o_.max_restarts)
          return finish(kExitGaveUp, "gave up: " + std::to_string(failures_) + " failure(s), --max-restarts is " +
                                         std::to_string(o_.max_restarts) + "; the last: " + rec.outcome);
        say("relaunching from the newest saved state, a host's snapshot or a checkpoint (restart " +
            std::to_string(failures_) + " of " + std::to_string(o_.max_restarts) + ")");
        break;
      }
    }
    if (!wait_for_hosts(&usable, false)) return finish(interrupted_ ? kExitStopped : kExitGaveUp, "");
  }
}

}  // namespace hpc::launch

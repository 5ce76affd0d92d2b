#include "supervisor.hpp"

#include <fcntl.h>
#include <poll.h>
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
#include <iostream>
#include <sstream>

#include "ckpt/store.hpp"
#include "core/duration.hpp"
#include "core/error.hpp"
#include "subprocess.hpp"
#include "train/exit_codes.hpp"
#include "train/metrics.hpp"

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

std::string fixed(double v, int digits = 1) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(digits);
  os << v;
  return os.str();
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

// Variables every rank needs from hpcrun's environment (Open MPI forwards none by itself).
bool forwarded(const std::string& name) {
  if (name == "PATH" || name == "LD_LIBRARY_PATH") return true;
  for (const char* prefix : {"HPCTRAIN_", "HPCRUN_", "NCCL_", "OMP_", "FI_"})
    if (name.rfind(prefix, 0) == 0) return true;
  return false;
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

// ------------------------------------------------------------------------------ one attempt

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
    std::string agent;
    for (const std::string& w : agent_command()) agent += (agent.empty() ? "" : " ") + w;
    cmd.insert(cmd.end(), {"--mca", "plm_rsh_agent", agent});
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

// The first sign of a failure (a rank that failed, a host mpirun names) starts the clock on
// mpirun's teardown of the rest.
void Supervisor::note_failure(AttemptRecord& rec) {
  if (rec.failed_at < 0) rec.failed_at = now();
  if (teardown_deadline_ == 0) teardown_deadline_ = now() + o_.teardown_timeout;
}

void Supervisor::handle_output(const std::string& line, bool from_stderr, AttemptRecord& rec) {
  const TaggedLine t = parse_tagged(line, from_stderr);
  const std::string prefix =
      "[a" + std::to_string(rec.number) + ":" + (t.rank >= 0 ? "r" + std::to_string(t.rank) : "mpirun") + "] ";
  log_line(prefix + t.text);
  RankReport report;
  int alive_rank = -1;
  if (t.rank >= 0 && parse_report(t.text, &report)) {
    evidence_.reports.push_back(report);
    if (failed_by_itself(report) || (report.status.exited && report.status.code == train::kExitStepTimeout))
      note_failure(rec);
    return;  // the wrapper's lines stay in the log
  }
  if (t.rank >= 0 && parse_alive(t.text, &alive_rank)) {
    evidence_.alive.insert(alive_rank);
    return;
  }
  if (t.rank >= 0 && t.is_stderr) keep_error_line(evidence_.error_lines[t.rank], t.text);
  if (t.rank < 0) {
    const std::string blamed = host_blamed_by_mpirun(t.text);
    if (!blamed.empty()) {
      evidence_.blamed_by_mpirun.push_back(blamed);
      note_failure(rec);
    }
  }
  // After a rank's usage error, mpirun's account of the abort (a dozen lines) would bury the
  // program's own message: it stays in the attempt's log.
  const bool usage_error_seen = std::any_of(evidence_.reports.begin(), evidence_.reports.end(), is_usage_error);
  // "Forwarding signal 12 to job": hpcrun has said why it sent one.
  const bool forwarding = t.rank < 0 && t.text.rfind("mpirun: Forwarding signal", 0) == 0;
  if (o_.quiet || forwarding || (t.rank < 0 && usage_error_seen)) return;
  std::FILE* out = t.is_stderr ? stderr : stdout;
  std::fprintf(out, "%s%s\n", prefix.c_str(), t.text.c_str());
  std::fflush(out);
}

void Supervisor::request_stop(Stop& stop, StopKind kind, const std::string& why) {
  if (stop.kind != StopKind::None) return;
  stop = {kind, why, now() + o_.stop_timeout};
  say("asking the job to checkpoint and stop: " + why);
}

void Supervisor::check_membership(const HostList& placement, Stop& stop) {
  const HostList known = known_hosts();
  if (o_.host_source == HostSource::Discovery) {
    for (const Host& h : placement)
      if (!contains(known, h.name)) return request_stop(stop, StopKind::Membership, "host " + h.name + " left the discovery output (draining it)");
  }
  const int np = total_slots(placement);
  if (o_.max_np && np >= o_.max_np) return;
  HostList candidates;
  for (const Host& h : known)
    if (!contains(placement, h.name) && !blacklist_.blocked(h.name, now())) candidates.push_back(h);
  if (candidates.empty()) return;
  const HostList joining = healthy(candidates);
  if (joining.empty()) return;
  std::string names;
  for (const Host& h : joining) {
    names += (names.empty() ? "" : ", ") + h.name;
    if (blacklist_.failures(h.name) > 0) say("host " + h.name + " is back after its cooldown");
  }
  request_stop(stop, StopKind::Membership, "growing onto " + names);
}

AttemptRecord Supervisor::run_attempt(const HostList& placement) {
  AttemptRecord rec;
  rec.number = first_attempt_ + static_cast<int>(attempts_.size());
  rec.hosts = placement;
  rec.np = total_slots(placement);
  rec.start = now();
  evidence_ = {};
  teardown_deadline_ = 0;

  const std::string log_path = (fs::path(o_.log_dir) / ("attempt-" + std::to_string(rec.number) + ".log")).string();
  attempt_log_.close();
  attempt_log_.open(log_path, std::ios::trunc);
  if (!attempt_log_) say("warning: cannot write " + log_path);
  ::setenv("HPCRUN_ATTEMPT", std::to_string(rec.number).c_str(), 1);
  ::setenv("HPCRUN_RESTART_COUNT", std::to_string(failures_).c_str(), 1);
  if (o_.host_source == HostSource::Slurm && !o_.launch_agent_given) {
    for (const auto& [name, value] : slurm_allocation_env(placement)) ::setenv(name.c_str(), value.c_str(), 1);
  }
  const std::vector<std::string> cmd = mpirun_command(placement);
  std::string shown;
  for (const std::string& a : cmd) shown += (shown.empty() ? "" : " ") + a;
  say("attempt " + std::to_string(rec.number) + ": " + std::to_string(rec.np) + " rank(s) on " + show_hosts(placement) +
      " (log " + log_path + ")");
  log_line("hpcrun: " + shown);

  heartbeat_.begin(now());
  Child mpirun = Child::spawn(cmd, SpawnOptions{});
  LineSplitter out_lines, err_lines;
  Stop stop;
  bool stalled = false, killed = false;
  double last_beat_poll = 0, last_membership = now(), sigkill_at = 0, query_deadline = 0;
  ExitStatus status;
  bool exited = false;
  double drain_deadline = 0;

  while (mpirun.out_fd() >= 0 || mpirun.err_fd() >= 0 || !exited) {
    std::vector<pollfd> fds = {{g_signal_pipe[0], POLLIN, 0}};
    if (mpirun.out_fd() >= 0) fds.push_back({mpirun.out_fd(), POLLIN, 0});
    if (mpirun.err_fd() >= 0) fds.push_back({mpirun.err_fd(), POLLIN, 0});
    ::poll(fds.data(), fds.size(), 100);
    for (size_t k = 1; k < fds.size(); ++k) {
      if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const bool is_err = fds[k].fd == mpirun.err_fd();
      LineSplitter& splitter = is_err ? err_lines : out_lines;
      std::vector<std::string> lines;
      const bool open = splitter.read_from(fds[k].fd, &lines);
      for (const std::string& l : lines) handle_output(l, is_err, rec);
      if (!open) {
        std::string rest;
        if (splitter.take_rest(&rest)) handle_output(rest, is_err, rec);
        if (is_err) mpirun.close_err();
        else mpirun.close_out();
      }
    }
    const double t = now();
    if (!exited && mpirun.poll(&status)) {
      exited = true;
      if (rec.failed_at < 0 && !status.success()) rec.failed_at = t;
      // Launch agents mpirun started may hold its pipes open after it is gone.
      drain_deadline = t + 2;
    }
    if (exited) {
      if (t >= drain_deadline) {
        mpirun.signal(SIGKILL);
        mpirun.close_out();
        mpirun.close_err();
      }
      continue;
    }

    // Signals to hpcrun: the first asks for a checkpoint-and-stop, a second kills the job.
    int sig;
    while (take_signal(&sig)) {
      ++signals_seen_;
      interrupted_ = true;
      if (signals_seen_ == 1 && stop.kind != StopKind::User) {
        stop = {};
        request_stop(stop, StopKind::User, std::string("hpcrun got ") + ::strsignal(sig) + " (a second one kills the job)");
        ::kill(mpirun.pid(), SIGUSR1);  // mpirun forwards it to every rank
      } else if (!killed) {
        say(std::string("got ") + ::strsignal(sig) + " again: killing the job without a checkpoint");
        mpirun.signal(SIGTERM);
        killed = true;
        sigkill_at = t + 3;
      }
    }

    // Progress
    if (t - last_beat_poll >= 0.1) {
      last_beat_poll = t;
      if (heartbeat_.poll(t)) {
        if (rec.first_step < 0) {
          rec.first_step = heartbeat_.step();
          rec.first_step_at = t;
          log_line("hpcrun: first step of attempt " + std::to_string(rec.number) + ": global step " + std::to_string(rec.first_step));
        }
        rec.last_step = heartbeat_.step();
      }
      if (o_.stall_timeout > 0 && heartbeat_.enabled() && !killed && !stalled && stop.kind == StopKind::None &&
          teardown_deadline_ == 0 && t - std::max(rec.start, heartbeat_.last_progress()) > o_.stall_timeout) {
        say("no step finished for " + show_duration(o_.stall_timeout) + " (--stall-timeout, heartbeat in " +
            o_.checkpoint_dir + "): asking which ranks respond, then killing the job");
        stalled = true;
        rec.failed_at = t;
        ::kill(mpirun.pid(), SIGUSR2);  // mpirun forwards it to every rank's wrapper, which answers
        query_deadline = t + std::min(2.0, o_.teardown_timeout);
      }
    }
    if (query_deadline > 0 && !killed && t > query_deadline) {
      mpirun.signal(SIGTERM);
      killed = true;
      sigkill_at = t + o_.teardown_timeout;
    }

    // Growth and draining
    // Not before the job runs: a stop request while mpirun is still starting it is lost.
    const bool running = heartbeat_.enabled() ? rec.first_step >= 0 : t - rec.start > 10;
    if (running && stop.kind == StopKind::None && teardown_deadline_ == 0 && !killed &&
        t - last_membership >= o_.discovery_interval) {
      last_membership = t;
      check_membership(placement, stop);
      if (stop.kind == StopKind::Membership) ::kill(mpirun.pid(), SIGUSR1);
    }

    // Deadlines: a stop that takes too long, a teardown that hangs (a host cut off), a kill.
    if (stop.kind != StopKind::None && !killed && t > stop.deadline) {
      say("the job did not stop within --stop-timeout " + show_duration(o_.stop_timeout) + "; killing it");
      mpirun.signal(SIGTERM);
      killed = true;
      sigkill_at = t + 3;
    }
    if (teardown_deadline_ > 0 && !killed && t > teardown_deadline_) {
      say("mpirun did not end the failed job within --teardown-timeout " + show_duration(o_.teardown_timeout) +
          " (a host unreachable?); killing it");
      mpirun.signal(SIGKILL);
      killed = true;
    }
    if (killed && sigkill_at > 0 && t > sigkill_at) {
      mpirun.signal(SIGKILL);
      sigkill_at = 0;
    }
  }
  mpirun.signal(SIGKILL);  // whatever mpirun left in its process group (launch agents)
  rec.end = now();
  attempt_log_ << "hpcrun: mpirun ended with " << status.show() << '\n';

  evidence_.mpirun_status = status;
  evidence_.stop_requested = stop.kind != StopKind::None;
  evidence_.stalled = stalled;
  const Analysis a = analyse_attempt(placement, evidence_);
  rec.verdict = a.verdict;
  rec.membership = stop.kind == StopKind::Membership && a.verdict == Verdict::Stopped;
  rec.failed_hosts.assign(a.failed_hosts.begin(), a.failed_hosts.end());
  rec.program_error = a.program_error;
  rec.outcome = a.verdict == Verdict::Stopped && rec.membership ? "stopped to change hosts: " + stop.why : a.reason;
  if (a.verdict != Verdict::Failure) rec.failed_at = -1;
  else if (rec.failed_at < 0) rec.failed_at = rec.end;
  return rec;
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

// --------------------------------------------------------------------------------- the loop

int Supervisor::run() {
  if (o_.host_source == HostSource::Discovery) discover(true);
  if (o_.program_is_hpctrain && o_.checkpoint_dir.empty())
    say("warning: hpctrain runs without --checkpoint-dir: a relaunch starts it over from step 0, and there is no "
        "heartbeat to detect a stall");

  HostList usable;
  if (!wait_for_hosts(&usable, true)) return finish(interrupted_ ? kExitStopped : kExitGaveUp, "");
  check_mpirun_accepts(place(usable, target_np(usable, true)));
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
        ++failures_;
        for (const std::string& h : rec.failed_hosts) {
          const double cooldown = blacklist_.fail(h, now());
          say("host " + h + " blacklisted for " + show_duration(cooldown) + " (failure " +
              std::to_string(blacklist_.failures(h)) + " of this host)");
        }
        if (failures_ > o_.max_restarts)
          return finish(kExitGaveUp, "gave up: " + std::to_string(failures_) + " failure(s), --max-restarts is " +
                                         std::to_string(o_.max_restarts) + "; the last: " + rec.outcome);
        say("relaunching from the last checkpoint (restart " + std::to_string(failures_) + " of " +
            std::to_string(o_.max_restarts) + ")");
        break;
      }
    }
    if (!wait_for_hosts(&usable, false)) return finish(interrupted_ ? kExitStopped : kExitGaveUp, "");
  }
}

// ------------------------------------------------------------------------------ the summary

int Supervisor::finish(int code, const std::string& last_line) {
  open_logs();
  print_summary();
  write_summary_json(code);
  if (!last_line.empty()) say(last_line);
  return code;
}

void Supervisor::print_summary() {
  if (attempts_.empty()) return;
  int failed = 0, changes = 0;
  for (const AttemptRecord& a : attempts_) failed += a.verdict == Verdict::Failure, changes += a.membership;
  say("summary: " + std::to_string(attempts_.size()) + " attempt(s), " + std::to_string(failed) + " failure(s), " +
      std::to_string(changes) + " host change(s), " + show_duration(now()) + " in all");
  for (size_t i = 0; i < attempts_.size(); ++i) {
    const AttemptRecord& a = attempts_[i];
    std::string line = "  attempt " + std::to_string(a.number) + ": " + std::to_string(a.np) + " rank(s) on " +
                       show_hosts(a.hosts) + ", " + show_duration(a.end - a.start);
    if (a.first_step >= 0) line += ", steps " + std::to_string(a.first_step) + "-" + std::to_string(a.last_step);
    line += ": " + a.outcome;
    say(line);
    if (a.verdict == Verdict::Failure && i + 1 < attempts_.size()) {
      const AttemptRecord& next = attempts_[i + 1];
      std::string lost = "  failure of attempt " + std::to_string(a.number) + ": ";
      if (next.first_step_at >= 0) {
        lost += fixed(next.first_step_at - a.failed_at) + " s from failure to the first step of attempt " + std::to_string(next.number);
        if (a.last_step >= 0 && next.first_step >= 0)
          lost += ", " + std::to_string(std::max<int64_t>(0, a.last_step - (next.first_step - 1))) + " step(s) redone";
      } else {
        lost += "attempt " + std::to_string(next.number) + " finished no step the heartbeat showed";
      }
      say(lost);
    }
  }
}

void Supervisor::write_summary_json(int exit_code) {
  const std::string path = (fs::path(o_.log_dir) / "summary.json").string(), tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::trunc);
  // Times of attempts are seconds since hpcrun started, at started_unix on the wall clock.
  out << "{\"exit_code\": " << exit_code << ", \"started_unix\": " << fixed(started_unix_, 3)
      << ", \"seconds\": " << fixed(now(), 3) << ", \"failures\": " << failures_
      << ", \"attempts\": [";
  for (size_t i = 0; i < attempts_.size(); ++i) {
    const AttemptRecord& a = attempts_[i];
    const char* verdict = a.verdict == Verdict::Success ? "success" : a.verdict == Verdict::Failure ? "failure"
                          : a.verdict == Verdict::UsageError ? "usage_error" : a.membership ? "host_change" : "stopped";
    out << (i ? ", " : "") << "{\"attempt\": " << a.number << ", \"np\": " << a.np << ", \"hosts\": "
        << train::json_string(show_hosts(a.hosts)) << ", \"start\": " << fixed(a.start, 3) << ", \"end\": " << fixed(a.end, 3)
        << ", \"result\": \"" << verdict << "\", \"outcome\": " << train::json_string(a.outcome) << ", \"failed_hosts\": [";
    for (size_t k = 0; k < a.failed_hosts.size(); ++k) out << (k ? ", " : "") << train::json_string(a.failed_hosts[k]);
    out << "], \"first_step\": " << a.first_step << ", \"last_step\": " << a.last_step;
    if (a.first_step_at >= 0) out << ", \"first_step_at\": " << fixed(a.first_step_at, 3);
    if (a.verdict == Verdict::Failure) {
      out << ", \"failed_at\": " << fixed(a.failed_at, 3);
      if (i + 1 < attempts_.size() && attempts_[i + 1].first_step_at >= 0) {
        const AttemptRecord& next = attempts_[i + 1];
        out << ", \"recovery_seconds\": " << fixed(next.first_step_at - a.failed_at, 3);
        if (a.last_step >= 0 && next.first_step >= 0)
          out << ", \"steps_redone\": " << std::max<int64_t>(0, a.last_step - (next.first_step - 1));
      }
    }
    out << "}";
  }
  out << "]}\n";
  out.close();
  if (!out || ::rename(tmp.c_str(), path.c_str()) != 0) say("warning: cannot write " + path);
}

}  // namespace hpc::launch

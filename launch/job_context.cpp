#include "job_context.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <random>

#include "ckpt/dir_lock.hpp"
#include "ckpt/store.hpp"
#include "core/error.hpp"
#include "core/file_identity.hpp"
#include "core/log.hpp"
#include "core/signal_safe_text.hpp"
#include "subprocess.hpp"

namespace hpc::launch {
namespace fs = std::filesystem;

namespace {

int g_signal_pipe[2] = {-1, -1};

void on_signal(int sig) {
  const signal_safe::KeepErrno keep;
  const unsigned char b = static_cast<unsigned char>(sig);
  [[maybe_unused]] ssize_t n = ::write(g_signal_pipe[1], &b, 1);
}

// SIGUSR2 as well: submitit and `sbatch --signal=B:USR2@...` send it to the batch script, which
// may be hpcrun itself; it ended hpcrun (exit 140) with no checkpoint and no summary.
constexpr int kHandled[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2};

std::string timestamp() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", std::localtime(&t));
  return buf;
}

}  // namespace

Clock::Clock()
    : started_(monotonic_seconds()),
      started_unix_(std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count()) {}

double Clock::now() const { return monotonic_seconds() - started_; }

void Voice::open(const std::string& log_dir) {
  if (hpcrun_log_.is_open()) return;
  std::error_code ec;
  require_safe_directory(log_dir, "--log-dir");  // before it is made in a folder others may write to
  make_directories(log_dir, kSharedDirectoryMode, ec);  // never others' to write in, whatever the umask
  HPC_REQUIRE(!ec, "--log-dir ", log_dir, ": cannot create it: ", ec.message());
  require_safe_directory(log_dir, "--log-dir");  // again, for one another user made meanwhile
  const std::string log = (fs::path(log_dir) / "hpcrun.log").string();
  // Made 0644 at most, as the attempts' logs and the checkpoints beside them, whatever the umask (an
  // ofstream's 0666 under umask 000 let every user rewrite the job's record). Never through a link
  // (root trusts a directory another user owns, who could point the name at one of root's files),
  // nor into a FIFO or device of that name.
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  struct stat st{};
  const bool regular = fd >= 0 && ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  HPC_REQUIRE(fd >= 0 || errno != ELOOP, "--log-dir ", log_dir, ": hpcrun.log there is a symbolic link: remove it");
  if (fd >= 0 && !regular) ::close(fd);
  HPC_REQUIRE(fd < 0 || regular, "--log-dir ", log_dir, ": hpcrun.log there is not a regular file: remove it");
  HPC_REQUIRE(fd >= 0 && open_stream_on(hpcrun_log_, fd), "--log-dir ", log_dir, ": cannot write in it");
  log_dir_ = log_dir;
  for (const std::string& line : early_lines_) hpcrun_log_ << line << '\n';
  hpcrun_log_ << std::flush;
  early_lines_.clear();
}

void Voice::log_line(const std::string& line) {
  if (attempt_log_.is_open()) attempt_log_ << line << '\n' << std::flush;
}

void Voice::to_hpcrun_log(const std::string& line) {
  if (hpcrun_log_.is_open()) hpcrun_log_ << timestamp() << " " << line << '\n' << std::flush;
  else early_lines_.push_back(timestamp() + " " + line);  // written when open() makes the file
}

void Voice::say(const std::string& line) {
  relay_error("hpcrun: " + line);
  to_hpcrun_log(line);
  log_line("hpcrun: " + line);
}

void Voice::relay_output(const std::string& line) {
  const int failed = log::write_standard_output(line + "\n");
  if (failed == 0 || output_lost_said_) return;
  output_lost_said_ = true;
  const std::string kept = log_dir_.empty() ? "its logs" : (fs::path(log_dir_) / "attempt-N.log").string();
  say("warning: standard output " + log::standard_output_trouble(failed) + ": the job goes on, its output kept in " +
      kept + " alone");
}

void Voice::relay_error(const std::string& line) {
  const std::string text = line + "\n";
  errno = 0;
  const bool written = std::fwrite(text.data(), 1, text.size(), stderr) == text.size() && std::fflush(stderr) == 0;
  const int failed = errno != 0 ? errno : EIO;
  if (written) return;
  std::clearerr(stderr);  // the next line is tried again (a disk that has room again takes it)
  if (!errors_lost_.empty()) return;
  // Not said on stderr, which cannot take it: in the logs alone, beside the lines it lost. (Before
  // the log directory exists, kept for hpcrun.log as every early line is.)
  errors_lost_ = std::string("warning: standard error cannot be written (") + std::strerror(failed) +
                 "): the job goes on, its errors and hpcrun's lines kept in the logs alone";
  to_hpcrun_log(errors_lost_);
  log_line("hpcrun: " + errors_lost_);
}

// Made with O_EXCL: two hpcruns on one log directory (two jobs started from one working
// directory, which share the default hpcrun-logs) each count their attempts from what they saw at
// start, and the later one's attempt-N.log truncated the earlier one's. Now a number another
// hpcrun has taken is passed over.
int Voice::open_attempt_log(const std::string& log_dir, int from, std::string* path) {
  const auto log_of = [&](int n) { return (fs::path(log_dir) / ("attempt-" + std::to_string(n) + ".log")).string(); };
  attempt_log_.close();
  for (int n = from; n < kMostAttempts; ++n) {
    *path = log_of(n);
    const int fd = ::open(path->c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && errno == EEXIST) continue;
    if (fd < 0) break;
    open_stream_on(attempt_log_, fd);  // the file made, not what its name may have become since
    if (!errors_lost_.empty()) log_line("hpcrun: " + errors_lost_);  // what its reader finds missing on the terminal
    return n;
  }
  *path = log_of(from);
  return from;
}

SignalInbox::SignalInbox() {
  HPC_CHECK(g_signal_pipe[0] < 0, "hpcrun's signal handlers are installed twice");
  HPC_CHECK(::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) == 0, "pipe: ", std::strerror(errno));
  struct sigaction sa{};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  // `nohup hpcrun ... &`: the user asked that the job outlive the terminal, whose hangup stopped
  // it (the children have process groups of their own, so the hangup reaches hpcrun alone).
  struct sigaction inherited{};
  hangup_ignored_ = ::sigaction(SIGHUP, nullptr, &inherited) == 0 && inherited.sa_handler == SIG_IGN;
  for (int s : kHandled)
    if (s != SIGHUP || !hangup_ignored_) ::sigaction(s, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  // An ignored SIGCHLD is inherited across exec (a launcher that ignores it to leave no zombies):
  // the kernel then reaped mpirun itself, waitpid never reported its end, and the attempt never
  // ended; every probe and the discovery script timed out.
  ::signal(SIGCHLD, SIG_DFL);
}

SignalInbox::~SignalInbox() {
  for (int s : kHandled) ::signal(s, s == SIGHUP && hangup_ignored_ ? SIG_IGN : SIG_DFL);
  for (int& fd : g_signal_pipe) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
}

int SignalInbox::fd() const { return g_signal_pipe[0]; }

bool SignalInbox::take(int* sig) {
  unsigned char b = 0;
  if (::read(g_signal_pipe[0], &b, 1) != 1) return false;
  *sig = b;
  ++taken_;
  return true;
}

void HeartbeatWatch::begin(double now, int attempt) {
  attempt_ = std::to_string(attempt);
  if (!enabled()) return;
  last_ = ckpt::read_heartbeat(dir_);
  last_change_ = now;
  step_ = -1;
  seen_ = false;
}

bool HeartbeatWatch::poll(double now) {
  if (!enabled()) return false;
  std::map<std::string, std::string> beat = ckpt::read_heartbeat(dir_);
  const int64_t step = ckpt::heartbeat_step(beat);
  if (beat == last_ || step < 0) return false;
  if (!ckpt::heartbeat_is_of(beat, hpcrun_token(), attempt_)) return false;  // another writer's
  last_ = std::move(beat);
  last_change_ = now;
  step_ = step;
  seen_ = true;
  return true;
}

std::string HeartbeatWatch::field(const std::string& key) const {
  const auto it = last_.find(key);
  return it == last_.end() ? "" : it->second;
}

LockWatch::LockWatch(std::string dir) {
  if (!dir.empty()) record_.emplace((fs::path(dir) / "lock").string());
}

bool LockWatch::held_by_another(double now, const std::string& token, const std::string& attempt,
                                std::string* holder) {
  if (!record_) return false;
  const std::map<std::string, std::string>& last = record_->look(now);
  const auto state = last.find("state");
  if (state == last.end() || state->second != "held" ||
      record_->unchanged_for(now) >= ckpt::DirectoryLock::stale_seconds() ||
      ckpt::names_hpcrun_attempt(last, token, attempt))
    return false;
  const auto by = last.find("hpcrun_attempt");
  const auto of = last.find("hpcrun_token");
  *holder = ckpt::describe_lock_holder(last) +
            (of != last.end() && of->second == token && by != last.end() ? ": attempt " + by->second + "'s rank 0"
                                                                           : ": another run");
  return true;
}

void mark_membership_change(const std::string& checkpoint_dir, bool on) {
  if (checkpoint_dir.empty()) return;
  // Off: ours only (one left by a killed hpcrun is not obeyed, and another's is its own).
  on ? ckpt::write_membership_marker(checkpoint_dir, hpcrun_token())
     : ckpt::remove_membership_marker(checkpoint_dir, hpcrun_token());
}

const std::string& hpcrun_token() {
  static const std::string token = [] {
    std::random_device random;
    char text[17];
    std::snprintf(text, sizeof text, "%08x%08x", static_cast<unsigned>(random()), static_cast<unsigned>(random()));
    return std::string(text);
  }();
  return token;
}

}  // namespace hpc::launch

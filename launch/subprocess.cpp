#include "subprocess.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/duration.hpp"
#include "core/error.hpp"

namespace hpc::launch {

namespace {

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// The signals a child takes back to their defaults: those hpcrun handles or ignores, and any other
// with a handler.
bool reset_in_child(int sig) {
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2, SIGPIPE, SIGCHLD})
    if (s == sig) return true;
  struct sigaction sa{};
  return ::sigaction(sig, nullptr, &sa) == 0 && sa.sa_handler != SIG_DFL && sa.sa_handler != SIG_IGN;
}

// In the forked child: only async-signal-safe calls until exec. Every signal is blocked when it
// starts (spawn blocks them across the fork), so no handler of hpcrun runs here: one would write
// into hpcrun's own signal pipe. A signal sent to hpcrun's process group before the child leaves
// it was hpcrun's, which acts on its own copy: the child drops it (ignored while pending).
[[noreturn]] void exec_child(const std::vector<std::string>& argv, const SpawnOptions& o, int out_w, int err_w,
                             int report_w, pid_t parent) {
  bool reset[NSIG] = {};
  for (int s = 1; s < NSIG; ++s)
    if ((reset[s] = reset_in_child(s))) ::signal(s, SIG_IGN);
  if (o.own_process_group) ::setpgid(0, 0);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  for (int s = 1; s < NSIG; ++s)
    if (reset[s]) ::signal(s, SIG_DFL);
  if (o.die_with_parent) {
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);  // the parent died before prctl took effect
  }
  const int devnull = ::open("/dev/null", O_RDONLY);
  if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
  ::dup2(out_w, STDOUT_FILENO);
  ::dup2(o.merge_stderr ? out_w : err_w, STDERR_FILENO);
  // Nothing else of hpcrun's reaches the program (its log files, the descriptors it inherited):
  // all above the three are closed at exec. report_w, needed until then, is closed at exec too.
  if (::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) != 0)  // a kernel before 5.11
    for (int fd = 3; fd < 4096; ++fd) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  for (const auto& [k, v] : o.env) ::setenv(k.c_str(), v.c_str(), 1);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  ::execvp(args[0], args.data());
  const int err = errno;
  [[maybe_unused]] ssize_t n = ::write(report_w, &err, sizeof err);
  ::_exit(127);
}

// The pipes of one spawn: every end still here is closed when it goes, so a spawn that fails
// (a pipe or the fork refused) leaks none.
struct SpawnPipes {
  int out[2] = {-1, -1}, err[2] = {-1, -1}, report[2] = {-1, -1};
  SpawnPipes() = default;
  ~SpawnPipes() {
    for (int* p : {out, err, report}) close_fd(p[0]), close_fd(p[1]);
  }
  SpawnPipes(const SpawnPipes&) = delete;
  SpawnPipes& operator=(const SpawnPipes&) = delete;
  static void make(int* p) { HPC_CHECK(::pipe2(p, O_CLOEXEC) == 0, "pipe: ", std::strerror(errno)); }
};

// fork() with every signal blocked across it (the child unblocks them once its handlers are gone).
pid_t fork_masked() {
  sigset_t all, old;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old);
  const pid_t pid = ::fork();
  const int fork_errno = errno;
  if (pid != 0) ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  errno = fork_errno;
  return pid;
}

}  // namespace

bool catches_signal(pid_t pid, int sig) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("SigCgt:", 0) != 0) continue;
    const unsigned long long mask = std::strtoull(line.c_str() + 7, nullptr, 16);
    return (mask >> (sig - 1)) & 1ULL;
  }
  return true;
}

double monotonic_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

ExitStatus ExitStatus::from_wait(int status) {
  ExitStatus s;
  if (WIFEXITED(status)) s.exited = true, s.code = WEXITSTATUS(status);
  else if (WIFSIGNALED(status)) s.signal = WTERMSIG(status);
  return s;
}

std::string ExitStatus::show() const {
  if (exited) return "exit code " + std::to_string(code);
  return "signal " + std::to_string(signal) + " (" + ::strsignal(signal) + ")";
}

Child Child::spawn(const std::vector<std::string>& argv, const SpawnOptions& options) {
  HPC_CHECK(!argv.empty());
  SpawnPipes p;
  SpawnPipes::make(p.out);
  SpawnPipes::make(p.report);
  if (!options.merge_stderr) SpawnPipes::make(p.err);
  const pid_t parent = ::getpid();
  const pid_t pid = fork_masked();
  HPC_CHECK(pid >= 0, "fork: ", std::strerror(errno));
  if (pid == 0) exec_child(argv, options, p.out[1], p.err[1], p.report[1], parent);
  close_fd(p.out[1]);
  close_fd(p.err[1]);
  close_fd(p.report[1]);
  if (options.own_process_group) ::setpgid(pid, pid);  // also here: no race with an early signal()
  int exec_errno = 0;
  ssize_t n;
  do n = ::read(p.report[0], &exec_errno, sizeof exec_errno);
  while (n < 0 && errno == EINTR);
  Child c;
  c.pid_ = pid;
  c.out_fd_ = std::exchange(p.out[0], -1);
  c.err_fd_ = std::exchange(p.err[0], -1);
  c.group_ = options.own_process_group;
  if (n == static_cast<ssize_t>(sizeof exec_errno)) {
    c.wait();
    usage_error("cannot run ", argv[0], ": ", std::strerror(exec_errno));
  }
  return c;
}

Child& Child::operator=(Child&& other) noexcept {
  if (this != &other) {
    this->~Child();
    pid_ = std::exchange(other.pid_, -1);
    out_fd_ = std::exchange(other.out_fd_, -1);
    err_fd_ = std::exchange(other.err_fd_, -1);
    group_ = other.group_;
    reaped_ = other.reaped_;
    status_ = other.status_;
  }
  return *this;
}

Child::~Child() {
  if (running()) {
    signal(SIGKILL);
    wait();
  }
  close_fd(out_fd_);
  close_fd(err_fd_);
  pid_ = -1;
}

void Child::close_out() { close_fd(out_fd_); }
void Child::close_err() { close_fd(err_fd_); }

bool Child::poll(ExitStatus* status) {
  if (pid_ <= 0) return false;
  if (!reaped_) {
    int st = 0;
    const pid_t r = ::waitpid(pid_, &st, WNOHANG);
    if (r != pid_) return false;
    reaped_ = true;
    status_ = ExitStatus::from_wait(st);
  }
  if (status) *status = status_;
  return true;
}

ExitStatus Child::wait() {
  if (pid_ > 0 && !reaped_) {
    int st = 0;
    pid_t r;
    do r = ::waitpid(pid_, &st, 0);
    while (r < 0 && errno == EINTR);
    reaped_ = true;
    status_ = ExitStatus::from_wait(st);
  }
  return status_;
}

void Child::signal(int sig) const {
  if (pid_ <= 0) return;
  // The group outlives its leader: what mpirun started locally (launch agents) is killed too.
  if (group_) ::kill(-pid_, sig);
  if (!reaped_) ::kill(pid_, sig);
}

bool LineSplitter::read_from(int fd, std::vector<std::string>* lines) {
  char buf[65536];
  const ssize_t n = ::read(fd, buf, sizeof buf);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
  if (n <= 0) return false;
  pending_.append(buf, static_cast<size_t>(n));
  size_t start = 0;
  for (size_t nl; (nl = pending_.find('\n', start)) != std::string::npos; start = nl + 1) {
    size_t end = nl;
    if (end > start && pending_[end - 1] == '\r') --end;
    lines->push_back(pending_.substr(start, end - start));
  }
  pending_.erase(0, start);
  // A program that never ends its line must not grow this without bound.
  if (pending_.size() > (1u << 20)) lines->push_back(std::exchange(pending_, {}));
  return true;
}

bool LineSplitter::take_rest(std::string* line) {
  if (pending_.empty()) return false;
  *line = std::exchange(pending_, {});
  return true;
}

std::string CommandResult::why() const {
  std::string tail = errors.find_first_not_of(" \t\r\n") != std::string::npos ? errors : output;
  while (!tail.empty() && (tail.back() == '\n' || tail.back() == '\r')) tail.pop_back();
  const size_t nl = tail.rfind('\n');
  if (nl != std::string::npos) tail = tail.substr(nl + 1);  // the last line says most
  if (!started) return tail;
  if (timed_out) return "no answer (timed out)";
  return status.show() + (tail.empty() ? "" : ": " + tail);
}

namespace {

// The pipes still open of the commands that started, each with its command's index; false when
// every command has ended and closed its pipes.
bool open_pipes(std::vector<Child>& children, const std::vector<CommandResult>& results, std::vector<pollfd>* fds,
                std::vector<size_t>* owner) {
  bool alive = false;
  for (size_t i = 0; i < children.size(); ++i) {
    if (!results[i].started) continue;
    for (int fd : {children[i].out_fd(), children[i].err_fd()}) {
      if (fd < 0) continue;
      fds->push_back({fd, POLLIN, 0});
      owner->push_back(i);
      alive = true;
    }
    ExitStatus st;
    if (!children[i].poll(&st)) alive = true;
  }
  return alive;
}

void close_pipe(Child& child, int fd) {
  if (fd == child.err_fd()) child.close_err();
  else child.close_out();
}

// Keeps the first kMaxCommandOutput bytes of what the pipe has (noting a stdout cut short: data,
// the discovery script's hosts, must not be taken whole when it is not); closes it at its end.
void read_pipe(Child& child, int fd, CommandResult& result) {
  char buf[4096];
  const ssize_t n = ::read(fd, buf, sizeof buf);
  const bool is_err = fd == child.err_fd();
  std::string& text = is_err ? result.errors : result.output;
  if (n > 0) {
    const size_t kept = std::min(static_cast<size_t>(n), kMaxCommandOutput - std::min(text.size(), kMaxCommandOutput));
    text.append(buf, kept);
    if (kept < static_cast<size_t>(n) && !is_err) result.output_cut = true;
  }
  if (n > 0 || (n < 0 && (errno == EINTR || errno == EAGAIN))) return;
  close_pipe(child, fd);
}

// Whether each command has ended (one that did not start has nothing to wait for).
std::vector<bool> ended(std::vector<Child>& children, const std::vector<CommandResult>& results) {
  std::vector<bool> out(children.size());
  for (size_t i = 0; i < children.size(); ++i) {
    ExitStatus st;
    out[i] = !results[i].started || children[i].poll(&st);
  }
  return out;
}

void kill_the_late(std::vector<Child>& children, std::vector<CommandResult>& results) {
  for (size_t i = 0; i < children.size(); ++i) {
    ExitStatus st;
    if (results[i].started && !children[i].poll(&st)) {
      results[i].timed_out = true;
      children[i].signal(SIGKILL);
    }
  }
}

}  // namespace

std::vector<CommandResult> run_commands(const std::vector<std::vector<std::string>>& commands, double timeout_seconds,
                                        bool merge_stderr) {
  std::vector<CommandResult> results(commands.size());
  std::vector<Child> children(commands.size());
  for (size_t i = 0; i < commands.size(); ++i) {
    try {
      SpawnOptions o;
      o.merge_stderr = merge_stderr;
      children[i] = Child::spawn(commands[i], o);
      results[i].started = true;
    } catch (const Error& e) {
      results[i].output = e.what();
    }
  }
  const double deadline = monotonic_seconds() + timeout_seconds;
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<size_t> owner;
    if (!open_pipes(children, results, &fds, &owner)) break;
    const double left = deadline - monotonic_seconds();
    if (left <= 0) {
      kill_the_late(children, results);
      break;
    }
    const std::vector<bool> done = ended(children, results);
    const int wait_ms = fds.empty() ? 20 : static_cast<int>(std::min(left, 0.05) * 1000) + 1;
    if (fds.empty()) ::usleep(static_cast<useconds_t>(wait_ms) * 1000);
    else ::poll(fds.data(), fds.size(), wait_ms);
    // A command that had ended before the poll had written all its answer: a pipe of its that is
    // empty now is held open only by a process it left behind (a daemon started with &), which may
    // never close it. Its answer is complete: hpcrun waited out the whole deadline for it (each
    // discovery, each probe), and took what that process printed later as part of it.
    for (size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents & (POLLIN | POLLHUP | POLLERR)) read_pipe(children[owner[k]], fds[k].fd, results[owner[k]]);
      else if (done[owner[k]]) close_pipe(children[owner[k]], fds[k].fd);
    }
  }
  for (size_t i = 0; i < children.size(); ++i)
    if (results[i].started) results[i].status = children[i].wait();
  return results;
}

CommandResult run_command(const std::vector<std::string>& command, double timeout_seconds, bool merge_stderr) {
  return run_commands({command}, timeout_seconds, merge_stderr).front();
}

std::string find_program(const std::string& program, std::string* why) {
  const auto executable = [](const std::string& p) {
    struct stat st{};
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
  };
  if (program.empty()) {
    *why = "no program given";
    return "";
  }
  if (program.find('/') != std::string::npos) {
    if (executable(program)) return program;
    struct stat st{};
    const bool exists = ::stat(program.c_str(), &st) == 0;
    *why = !exists ? "no such file" : S_ISDIR(st.st_mode) ? "it is a directory" : "it is not an executable file";
    return "";
  }
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/local/bin:/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
    if (executable(candidate)) return candidate;
  }
  *why = "not found in PATH";
  return "";
}

}  // namespace hpc::launch

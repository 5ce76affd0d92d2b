#include "rank_report.hpp"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <sstream>

#include "core/signal_safe_text.hpp"

namespace hpc::launch {

namespace {

constexpr const char* kTag = "hpcrun-rank-status:";
constexpr const char* kAliveTag = "hpcrun-rank-alive:";
constexpr const char* kSignalledTag = "hpcrun-rank-signalled:";
constexpr const char* kWrapperPrefix = "hpcrun-rank-";  // of each of the wrapper's lines

char g_alive_line[64], g_signalled_line[64];
size_t g_alive_length = 0, g_signalled_length = 0;

volatile sig_atomic_t g_child = 0, g_terminated = 0, g_stop = 0;

// Whatever mpirun sends the wrapper is meant for the program.
void forward(int sig) {
  const signal_safe::KeepErrno keep;
  if (sig == SIGUSR2) {  // hpcrun's liveness query: answered here, never forwarded
    [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, g_alive_line, g_alive_length);
    return;
  }
  if (sig == SIGCONT) {
    // mpirun sends it ahead of SIGTERM when it tears a job down; it means nothing alone.
  } else if (sig == SIGUSR1) {
    if (!g_terminated) g_stop = 1;
  } else if (!g_stop) {
    if (!g_terminated) {  // the teardown reached this host (rank_report.hpp)
      [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, g_signalled_line, g_signalled_length);
    }
    g_terminated = 1;
  }
  if (g_child > 0) ::kill(g_child, sig);
}

bool parse_rank_line(const std::string& text, const char* tag, int* rank) {
  if (text.rfind(tag, 0) != 0) return false;
  const std::string rest = text.substr(std::strlen(tag));
  const size_t eq = rest.find("rank=");
  if (eq == std::string::npos) return false;
  try {
    *rank = std::stoi(rest.substr(eq + 5));
  } catch (const std::exception&) {
    return false;
  }
  return true;
}
}  // namespace

bool parse_alive(const std::string& text, int* rank) { return parse_rank_line(text, kAliveTag, rank); }
bool parse_signalled(const std::string& text, int* rank) { return parse_rank_line(text, kSignalledTag, rank); }

std::string format_report(const RankReport& r) {
  std::ostringstream os;
  os << kTag << " rank=" << r.rank;
  if (r.status.exited) os << " exit=" << r.status.code;
  else os << " signal=" << r.status.signal;
  os << " terminated=" << (r.terminated ? 1 : 0) << " stop_requested=" << (r.stop_requested ? 1 : 0);
  return os.str();
}

bool parse_report(const std::string& text, RankReport* r) {
  if (text.rfind(kTag, 0) != 0) return false;
  std::stringstream words(text.substr(std::strlen(kTag)));
  RankReport out;
  bool have_rank = false, have_end = false;
  for (std::string w; words >> w;) {
    const size_t eq = w.find('=');
    if (eq == std::string::npos) return false;
    const std::string key = w.substr(0, eq);
    int value = 0;
    try {
      value = std::stoi(w.substr(eq + 1));
    } catch (const std::exception&) {
      return false;
    }
    if (key == "rank") out.rank = value, have_rank = true;
    else if (key == "exit") out.status.exited = true, out.status.code = value, have_end = true;
    else if (key == "signal") out.status.exited = false, out.status.signal = value, have_end = true;
    else if (key == "terminated") out.terminated = value != 0;
    else if (key == "stop_requested") out.stop_requested = value != 0;
  }
  if (!have_rank || !have_end) return false;
  *r = out;
  return true;
}

TaggedLine parse_tagged(const std::string& line, bool from_stderr) {
  TaggedLine t;
  t.is_stderr = from_stderr;
  t.text = line;
  // "[jobid,rank]<stdout>:" or "<stderr>:"
  if (line.size() < 4 || line[0] != '[') return t;
  const size_t comma = line.find(','), close = line.find(']');
  if (comma == std::string::npos || close == std::string::npos || comma > close) return t;
  const std::string rank = line.substr(comma + 1, close - comma - 1);
  if (rank.empty() || rank.find_first_not_of("0123456789") != std::string::npos || rank.size() > 9) return t;
  const std::string rest = line.substr(close + 1);
  for (const char* stream : {"<stdout>:", "<stderr>:", "<stddiag>:"}) {
    if (rest.rfind(stream, 0) == 0) {
      t.rank = std::stoi(rank);
      t.is_stderr = std::strcmp(stream, "<stdout>:") != 0;
      t.text = rest.substr(std::strlen(stream));
      return t;
    }
  }
  return t;
}

namespace {

// The length of the tag "[job,rank]<stream>:" of job `job` ("[1,") that begins `s` at `at`, 0 where
// none does.
size_t tag_at(const std::string& s, size_t at, const std::string& job) {
  if (s.compare(at, job.size(), job) != 0) return 0;
  size_t i = at + job.size();
  const size_t digits = i;
  while (i < s.size() && i - digits < 10 && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  if (i == digits || i >= s.size() || s[i] != ']') return 0;
  ++i;
  for (const char* stream : {"<stdout>:", "<stderr>:", "<stddiag>:"})
    if (s.compare(i, std::strlen(stream), stream) == 0) return i + std::strlen(stream) - at;
  return 0;
}

}  // namespace

std::vector<std::string> split_rank_line(const std::string& line) {
  TaggedLine t = parse_tagged(line, false);
  if (t.rank < 0) return {line};
  const std::string job = line.substr(0, line.find(',') + 1);
  std::string tag = line.substr(0, line.size() - t.text.size());
  std::vector<std::string> pieces;
  std::string rest = t.text;
  for (;;) {
    // The next piece begins where a tag of this job comes (this rank's or another's: mpirun writes
    // each piece it reads after the last, line end or not), or on stderr where a wrapper's line
    // does, read by mpirun with the text before it.
    size_t cut = std::string::npos, skip = 0;
    for (size_t b = rest.find(job); b != std::string::npos; b = rest.find(job, b + 1))
      if ((skip = tag_at(rest, b, job)) > 0) {
        cut = b;
        break;
      }
    if (const size_t w = t.is_stderr ? rest.find(kWrapperPrefix, 1) : std::string::npos; w < cut) cut = w, skip = 0;
    if (cut == std::string::npos) break;
    pieces.push_back(tag + rest.substr(0, cut));
    if (skip > 0) {
      tag = rest.substr(cut, skip);
      t = parse_tagged(tag, false);
    }
    rest.erase(0, cut + skip);
  }
  pieces.push_back(tag + rest);
  return pieces;
}

namespace {

const int kForwarded[] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2, SIGCONT};

// The answer to a liveness query, written from the signal handler: made ready beforehand.
void prepare_alive_line(int rank) {
  const int n = std::snprintf(g_alive_line, sizeof g_alive_line, "%s rank=%d\n", kAliveTag, rank);
  g_alive_length = n > 0 ? std::min(static_cast<size_t>(n), sizeof g_alive_line - 1) : 0;
  const int m = std::snprintf(g_signalled_line, sizeof g_signalled_line, "%s rank=%d\n", kSignalledTag, rank);
  g_signalled_length = m > 0 ? std::min(static_cast<size_t>(m), sizeof g_signalled_line - 1) : 0;
}

// The program's signal mask: the wrapper's without the forwarded signals (which
// block_forwarded_signals() blocked since the wrapper started). hpctrain blocks its stop signals
// before anything else runs (its .preinit_array), and is started with them blocked already: one
// passed on as soon as it starts then waits for its signal thread instead of ending it first.
sigset_t program_mask(const char* program, sigset_t mask) {
  for (int s : kForwarded) sigdelset(&mask, s);
  const char* slash = std::strrchr(program, '/');
  if (std::strcmp(slash ? slash + 1 : program, "hpctrain") == 0)
    for (int s : {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2}) sigaddset(&mask, s);
  return mask;
}

// Forks the program with the signals in `block` blocked across the fork, so that none is lost
// between the fork and g_child being set; one that came before is passed on once it is. -1 when
// fork failed.
pid_t start_program(char** argv, const sigset_t& block) {
  sigset_t old;
  ::sigprocmask(SIG_BLOCK, &block, &old);
  const sigset_t program = program_mask(argv[0], old);
  for (int s : kForwarded) sigdelset(&old, s);
  struct sigaction sa{};
  sa.sa_handler = forward;
  sigemptyset(&sa.sa_mask);
  for (int s : kForwarded) ::sigaction(s, &sa, nullptr);
  const pid_t parent = ::getpid();
  const pid_t child = ::fork();
  if (child == 0) {
    for (int s : kForwarded) ::signal(s, SIG_DFL);
    ::sigprocmask(SIG_SETMASK, &program, nullptr);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // no orphaned rank if the wrapper itself is killed
    if (::getppid() != parent) ::_exit(127);
    ::execvp(argv[0], argv);
    std::fprintf(stderr, "hpcrun: error: cannot run %s: %s\n", argv[0], std::strerror(errno));
    ::_exit(127);
  }
  if (child > 0) g_child = child;
  const int fork_errno = errno;  // for the caller's message
  ::sigprocmask(SIG_SETMASK, &old, nullptr);
  errno = fork_errno;
  return child;
}

// Die the way the program died, so that mpirun reports the same signal.
int end_as(const RankReport& report, const sigset_t& block) {
  if (report.status.exited) return report.status.code;
  ::signal(report.status.signal, SIG_DFL);
  ::sigprocmask(SIG_UNBLOCK, &block, nullptr);
  ::raise(report.status.signal);
  return 128 + report.status.signal;
}

}  // namespace

void block_forwarded_signals() {
  sigset_t block;
  sigemptyset(&block);
  for (int s : kForwarded) sigaddset(&block, s);
  ::sigprocmask(SIG_BLOCK, &block, nullptr);
}

int rank_exec_main(int argc, char** argv) {
  if (argc < 1) {
    std::fprintf(stderr, "hpcrun: error: --rank-exec needs a program\n");
    return 2;
  }
  const char* rank_env = std::getenv("OMPI_COMM_WORLD_RANK");
  if (!rank_env) rank_env = std::getenv("PMIX_RANK");
  RankReport report;
  report.rank = rank_env ? std::atoi(rank_env) : -1;
  prepare_alive_line(report.rank);

  sigset_t block;
  sigemptyset(&block);
  for (int s : kForwarded) sigaddset(&block, s);
  // A rank outlives no launcher. Open MPI puts each rank in a process group of its own, so
  // hpcrun's signals to mpirun's group never reach it, and mpirun can end without ending its
  // ranks: beside a booting Slurm test cluster it exited (code 1) on hpcrun's SIGTERM and left
  // the rank running, an orphan that went on writing the heartbeat the next attempt read. When
  // the launcher (mpirun here, Open MPI's daemon on another host) dies, the wrapper gets the
  // SIGTERM a teardown would have sent and passes it on, as it does mpirun's (one before the
  // program starts ends the wrapper alone). Checked after it is set, for a launcher already gone.
  const pid_t launcher = ::getppid();
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != launcher) {
    std::fprintf(stderr, "hpcrun: error: rank %d: its launcher ended before the program started\n", report.rank);
    return 1;
  }
  // The launching hpcrun's umask (HPCRUN_UMASK), not the one Open MPI's daemon had: over ssh, sshd's.
  if (const char* mask = std::getenv("HPCRUN_UMASK")) {
    char* end = nullptr;
    const unsigned long value = std::strtoul(mask, &end, 8);
    if (*mask != '\0' && *end == '\0' && value <= 0777) ::umask(static_cast<mode_t>(value));
  }
  const pid_t child = start_program(argv, block);
  if (child < 0) {
    std::fprintf(stderr, "hpcrun: error: rank %d: fork: %s\n", report.rank, std::strerror(errno));
    return 1;
  }
  int st = 0;
  pid_t r;
  do r = ::waitpid(child, &st, 0);
  while (r < 0 && errno == EINTR);
  report.status = ExitStatus::from_wait(st);
  report.terminated = g_terminated != 0;
  report.stop_requested = g_stop != 0;
  std::fflush(stdout);
  std::fprintf(stderr, "%s\n", format_report(report).c_str());
  std::fflush(stderr);
  return end_as(report, block);
}

}  // namespace hpc::launch

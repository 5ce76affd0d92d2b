#include "core/log.hpp"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>

namespace hpc::log {
namespace {
int g_rank = 0;
int g_world = 1;
std::string g_where;  // "rank 1 on node7"
Level g_level = Level::Info;
Stamps g_stamps = Stamps::Auto;
std::mutex g_mutex;  // lines from the loader thread and the main thread must not interleave

// Variables that Open MPI, PMIx, MPICH/PMI, MVAPICH, Slurm's srun and hpcrun set in the processes
// they start.
constexpr const char* kLauncherVariables[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK",    "PMI_RANK",
                                              "MV2_COMM_WORLD_RANK",  "SLURM_PROCID", "HPCRUN_ATTEMPT"};
}  // namespace

void set_process(int rank, int world_size, const std::string& where) {
  g_rank = rank;
  g_world = world_size;
  g_where = where;
}
void set_level(Level level) { g_level = level; }
void set_stamps(Stamps stamps) { g_stamps = stamps; }
Level level() { return g_level; }
int rank() { return g_rank; }

namespace {
// Whether the environment was a person's, read once before main(): MPI_Init sets Open MPI's and
// PMIx's rank variables in a process started without a launcher too (a singleton).
bool person_environment() {
  const char* term = std::getenv("TERM");
  if (term == nullptr || *term == '\0' || std::strcmp(term, "dumb") == 0) return false;
  for (const char* v : kLauncherVariables)
    if (std::getenv(v) != nullptr) return false;
  return true;
}
const bool g_person_environment = person_environment();
}  // namespace

bool interactive(int fd) { return g_person_environment && isatty(fd) != 0; }

std::string stamp(FILE* out, bool warning) {
  static const bool stdout_interactive = interactive_stdout(), stderr_interactive = interactive(2);
  const bool auto_on = out == stdout ? !stdout_interactive : warning && out == stderr && !stderr_interactive;
  const bool on = g_stamps == Stamps::On || (g_stamps == Stamps::Auto && auto_on);
  if (!on) return "";
  const auto now = std::chrono::system_clock::now();
  const std::time_t secs = std::chrono::system_clock::to_time_t(now);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm utc{};
  gmtime_r(&secs, &utc);
  char buf[40];
  const size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &utc);
  std::snprintf(buf + n, sizeof buf - n, ".%03dZ ", static_cast<int>(ms));
  return buf;
}

namespace {
// The first failed write of standard output's that was seen: its errno, or kUnknown where it failed
// inside a write that moved more than the buffer holds, the errno gone by the time it is asked.
constexpr int kUnknown = -1;
int g_stdout_error = 0;
bool g_help = false;  // what was printed is --help's or --version's
bool g_progress_output = false;  // standard output holds a training's progress lines, not results
}  // namespace

void write(Level lvl, const std::string& line) {
  if (lvl < g_level) return;
  std::string prefix = "hpctrain";
  if (lvl == Level::Warn) prefix += ": warning";
  if (lvl == Level::Error) prefix += ": error";
  // Another rank's line says whose it is (as its errors do), unless it begins by saying so. (Which
  // ranks speak below warnings is each command's choice: training's other ranks are set to Warn,
  // clean-snapshots speaks on each host's first rank.)
  const bool named = g_world > 1 && g_rank != 0 && line.rfind(g_where, 0) != 0;
  std::lock_guard lock(g_mutex);
  FILE* out = lvl >= Level::Warn ? stderr : stdout;
  const std::string text = detail::concat(stamp(out, lvl == Level::Warn), prefix, ": ", named ? g_where : "",
                                          named ? ": " : "", line, "\n");
  int failed = 0;
  // Standard output's through write_standard_output, which keeps the errno of a write that fails
  // inside it: a line longer than stdio's buffer fails in the call that writes it, and a flush
  // after it finds nothing left to write ("a write failed" where "No space left on device" was known).
  if (out == stdout) {
    failed = write_standard_output(text);
  } else {
    std::fwrite(text.data(), 1, text.size(), out);
    std::fflush(out);
  }
  // A training's progress lines that cannot be written, its reader gone (`hpctrain ... | head`;
  // SIGPIPE is ignored) or `> file` on a full disk: the run goes on, said once, rather than dying
  // unannounced in the middle of a step or a checkpoint. A command's lines (clean-snapshots'
  // "removed ...") are not: its results are checked at its end (require_standard_output_written),
  // its one error line; a warning before it spoke of a run and its progress lines that it has not.
  static bool said = false;
  if (failed != 0 && !said && g_progress_output) {
    said = true;
    std::fprintf(stderr, "%s%s: warning: standard output %s: the run goes on without its progress lines\n",
                 stamp(stderr, true).c_str(), prefix.substr(0, prefix.find(':')).c_str(),
                 standard_output_trouble(failed).c_str());
    std::fflush(stderr);
  }
}

std::string standard_output_trouble(int failed) {
  if (failed == EPIPE) return "is closed (its reader exited)";
  return detail::concat("cannot be written (", failed == kUnknown ? "a write failed" : std::strerror(failed), ")");
}

void set_progress_output() { g_progress_output = true; }

int flush_standard_output() {
  errno = 0;
  if (std::fflush(stdout) != 0 && g_stdout_error == 0) g_stdout_error = errno ? errno : kUnknown;
  if (std::ferror(stdout) && g_stdout_error == 0) g_stdout_error = kUnknown;
  return g_stdout_error;
}

int write_standard_output(const std::string& text) {
  errno = 0;
  if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() && g_stdout_error == 0)
    g_stdout_error = errno ? errno : kUnknown;
  return flush_standard_output();
}

void write_help(const std::string& text) {
  g_help = true;
  write_standard_output(text);
}

void require_standard_output_written() {
  int error = flush_standard_output();
  if (error == EPIPE && g_help) return;
  const int copy = error == 0 ? ::dup(STDOUT_FILENO) : -1;  // none: standard output closed, nothing written
  if (copy >= 0 && ::close(copy) != 0 && errno != EINTR) error = errno;
  if (error == kUnknown)
    usage_error("cannot write the results to standard output: a write failed (a full disk? its reader gone?)");
  if (error != 0) usage_error("cannot write the results to standard output: ", std::strerror(error));
}

}  // namespace hpc::log

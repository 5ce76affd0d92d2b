// Child processes for the launcher: mpirun (output piped back line by line, in its own process
// group so that hpcrun decides what a Ctrl-C means), and short commands run with a deadline
// (health probes through the launch agent, the host discovery script). RAII: a Child that goes
// out of scope still running is killed and reaped, so no path leaves a stray mpirun behind.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace hpc::launch {

// Seconds on the monotonic clock: the launcher's time base for deadlines and timings.
double monotonic_seconds();

// How a process ended.
struct ExitStatus {
  bool exited = false;  // false: killed by `signal`
  int code = 0;
  int signal = 0;
  static ExitStatus from_wait(int status);
  bool success() const { return exited && code == 0; }
  int shell_code() const { return exited ? code : 128 + signal; }  // as a shell's $? shows it
  std::string show() const;  // "exit code 3", "signal 9 (Killed)"
};

struct SpawnOptions {
  std::vector<std::pair<std::string, std::string>> env;  // set in the child
  bool own_process_group = true;
  bool die_with_parent = true;  // SIGTERM to the child if hpcrun dies (prctl PDEATHSIG)
  bool merge_stderr = false;    // stderr into the stdout pipe
};

class Child {
 public:
  Child() = default;
  // Starts argv[0] (searched in PATH) with stdout and stderr piped. A program that cannot be
  // started is a usage error naming it and why.
  static Child spawn(const std::vector<std::string>& argv, const SpawnOptions& options);
  Child(Child&& other) noexcept { *this = std::move(other); }
  Child& operator=(Child&& other) noexcept;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child();

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0 && !reaped_; }
  int out_fd() const { return out_fd_; }
  int err_fd() const { return err_fd_; }
  void close_out();
  void close_err();
  // Non-blocking: true once the process has ended (its status in `status`).
  bool poll(ExitStatus* status);
  // Blocks until it ends.
  ExitStatus wait();
  // To the whole process group when the child leads one (mpirun and what it started locally).
  void signal(int sig) const;

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1, err_fd_ = -1;
  bool group_ = false, reaped_ = false;
  ExitStatus status_;
};

// Splits bytes read from a pipe into lines ('\n'; a trailing '\r' is dropped).
class LineSplitter {
 public:
  // Reads what is available from fd; false at end of file (or error). Complete lines go to `lines`.
  bool read_from(int fd, std::vector<std::string>* lines);
  // What is left after end of file, as a last line.
  bool take_rest(std::string* line);

 private:
  std::string pending_;
};

// What a command's stdout and its stderr each keep (a command that prints without end fills no memory).
constexpr size_t kMaxCommandOutput = 1u << 20;

// A command run to completion or to its deadline (then killed with its process group).
struct CommandResult {
  bool started = false;   // false: could not be started (`output` says why)
  bool timed_out = false;
  ExitStatus status;
  std::string output;     // stdout, and stderr with it unless kept apart
  std::string errors;     // stderr, when kept apart
  bool output_cut = false;  // stdout went past kMaxCommandOutput: only its first bytes are in `output`
  bool ok() const { return started && !timed_out && status.success(); }
  std::string why() const;  // "timed out after 10 s", "exit code 255: ssh: connect to host ..."
};
// Runs all the commands at once and returns when each has ended or `timeout_seconds` passed.
// With `merge_stderr` false, stderr goes to `errors`: for output that is data (the discovery
// script's host list), where a warning on stderr is not a host.
std::vector<CommandResult> run_commands(const std::vector<std::vector<std::string>>& commands, double timeout_seconds,
                                        bool merge_stderr = true);
CommandResult run_command(const std::vector<std::string>& command, double timeout_seconds, bool merge_stderr = true);

// The path of PROGRAM as execvp would find it, or "" (then `why` says why).
std::string find_program(const std::string& program, std::string* why);

// Whether process `pid` has a handler for `sig` (Linux's /proc/PID/status, SigCgt); true where
// that cannot be read. A program starting up may not have one yet: the signal's default
// action (for most, the end of the process) would take its place.
bool catches_signal(pid_t pid, int sig);

}  // namespace hpc::launch

// Errors and check macros. Two kinds of failure exist for a user: their input was wrong
// (usage/input error: one clear line, exit code 2) or hpctrain itself failed (exit code 1).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace hpc {

enum class ErrorKind { Usage, Internal };

// `text` as one printable line: control characters (a newline inside a path or value a user
// gave) written as escapes, so that an error stays the one line its contract promises.
std::string one_line(const std::string& text);

// one_line with each backslash doubled first, so that an escape is told apart from the same
// characters in the text: "a\nb" with a newline prints a\nb, with a backslash and an n a\\nb.
// For what hpctrain prints as its output, not as an error (predict's paths and class names,
// inspect's lines), which a reader may want to take back to its bytes.
std::string one_line_unambiguous(const std::string& text);

// An error's message is one printable line (one_line): a NUL from a file's bytes (a class name, a
// header field) would end the C string what() early, hiding the problem, and a line break in a
// name a user gave (a folder, a value) would split it.
class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& what) : std::runtime_error(one_line(what)), kind_(kind) {}
  ErrorKind kind() const { return kind_; }
  int exit_code() const { return kind_ == ErrorKind::Usage ? 2 : 1; }

 private:
  ErrorKind kind_;
};

namespace detail {
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void throw_internal(const char* file, int line, const char* cond, const std::string& msg);
}  // namespace detail

// What an exception that is not ours means to a user: its what(), but std::thread's EAGAIN
// ("Resource temporarily unavailable", alone) says which limit was reached: this user's processes
// and threads (ulimit -u, a cgroup's pids.max) or the memory for a thread's stack (ulimit -v).
std::string what_it_means(const std::exception& e);

// What a std::bad_alloc means to a user: the job asks for more memory than there is (exit 1,
// a failure, but no bug to report), and which settings decide how much.
inline constexpr const char* kOutOfMemory =
    "out of memory (a smaller --batch-size, --eval-batch-size, --image-size or model needs less)";

// A problem the user can fix: bad flag, bad file, bad value. Message names the problem.
template <class... Args>
[[noreturn]] void usage_error(const Args&... args) {
  throw Error(ErrorKind::Usage, detail::concat(args...));
}

// A system call on `path` failed: "cannot <what> <path>: <errno's text>" as a usage error (a full
// disk, a read-only or missing directory, permissions: the user's to fix). Call it before anything
// else can change errno.
[[noreturn]] void io_error(const std::string& what, const std::string& path);

}  // namespace hpc

// Internal invariant: carries file and line, because only a developer can act on it.
#define HPC_CHECK(cond, ...)                                                              \
  do {                                                                                    \
    if (!(cond)) ::hpc::detail::throw_internal(__FILE__, __LINE__, #cond,                 \
                                               ::hpc::detail::concat("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)

// User-facing validation: throws a usage error (exit code 2) with the given message.
#define HPC_REQUIRE(cond, ...)                      \
  do {                                              \
    if (!(cond)) ::hpc::usage_error(__VA_ARGS__);   \
  } while (0)

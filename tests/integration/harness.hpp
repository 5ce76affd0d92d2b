// Shared by the integration tests: run the hpctrain binary and capture what it says, temporary
// directories, small IDX dataset files, and a strict parser for the metrics file's JSON lines.
#pragma once

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include <cctype>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "temp_dir.hpp"

extern char** environ;

namespace hpc::itest {
namespace fs = std::filesystem;

// Paths baked in by tests/CMakeLists.txt.
inline std::string hpctrain_binary() { return HPCTRAIN_BIN; }
inline std::string fashion_mnist_dir() { return HPCTRAIN_TEST_FASHION_MNIST_DIR; }

using hpc::testing::TempDir;  // (temp_dir.hpp)

// The revision a build of this tree records (core/revision.cpp, made by
// cmake/HpctrainRevision.cmake), as git says it now: the commit's 12 hex digits, "-dirty" when
// tracked files differ from it; "unknown" without git.
inline std::string tree_revision() {
  const std::string top = std::string(HPCTRAIN_TESTS_DIR) + "/..";
  const auto said = [&](const std::string& args) {
    std::string out;
    if (FILE* p = popen(("git -C '" + top + "' " + args + " 2>/dev/null").c_str(), "r")) {
      char buf[256];
      for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
      if (pclose(p) != 0) out.clear();
    }
    return out;
  };
  std::string commit = said("rev-parse --short=12 HEAD");
  while (!commit.empty() && commit.back() == '\n') commit.pop_back();
  if (commit.empty()) return "unknown";
  return commit + (said("status --porcelain --untracked-files=no").empty() ? "" : "-dirty");
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + path);
}

inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Each line of `text` without the time stamp ("2026-11-23T18:04:02.123Z ") it starts with, if any.
inline std::string unstamped(const std::string& text) {
  std::string out;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    end = end == std::string::npos ? text.size() : end + 1;
    const std::string line = text.substr(at, end - at);
    const bool stamped = line.size() > 25 && line[4] == '-' && line[10] == 'T' && line[19] == '.' && line[23] == 'Z' &&
                         line[24] == ' ' && std::isdigit(static_cast<unsigned char>(line[0]));
    out += stamped ? line.substr(25) : line;
    at = end;
  }
  return out;
}

struct RunResult {
  int exit_code = -1;  // -1: killed by a signal
  std::string out;
  // stderr as the tests compare it: without the time stamps that start warnings' lines in a
  // file (core/log.hpp); raw_err as written (tests/integration/output_test.cpp reads the stamps).
  std::string err, raw_err;
  std::string command;  // for messages
  double seconds = 0;     // wall-clock time it ran
  bool timed_out = false;  // killed by run_program's deadline
};

// A program started in the background: argv[0] with the rest as its arguments; stdout and
// stderr go to files (no pipe to fill up) and are read back by finish(). It runs in a process
// group of its own; with a deadline (seconds > 0), finish() kills the whole group (mpirun and
// its ranks, stopped ones too) when it passes, so a hang fails the test instead of blocking it.
// Tests that signal a program while it runs use pid() meanwhile.
class Started {
 public:
  explicit Started(std::vector<std::string> argv_s) : t0_(std::chrono::steady_clock::now()) {
    std::vector<char*> argv;
    for (auto& a : argv_s) {
      argv.push_back(a.data());
      command_ += (command_.empty() ? "" : " ") + a;
    }
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, out_path().c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, err_path().c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);
    const int rc = posix_spawn(&pid_, argv[0], &fa, &attr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    if (rc != 0) throw std::runtime_error("cannot start " + argv_s[0]);
  }
  Started(const Started&) = delete;
  Started& operator=(const Started&) = delete;
  ~Started() {  // a test that failed before finish(): nothing is left running
    if (finished_) return;
    kill(-pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }

  pid_t pid() const { return pid_; }
  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }
  std::string out_path() const { return io_.file("stdout"); }
  std::string err_path() const { return io_.file("stderr"); }
  // Whether it has not exited yet (its exit status is left for finish()).
  bool running() const {
    siginfo_t info{};
    return !finished_ && waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
           info.si_pid == 0;
  }

  RunResult finish(double deadline_seconds = 0) {
    RunResult r;
    r.command = command_;
    int status = 0;
    for (;;) {
      const pid_t done = waitpid(pid_, &status, deadline_seconds > 0 ? WNOHANG : 0);
      if (done == pid_) break;
      if (done < 0 && errno != EINTR) throw std::runtime_error("waitpid failed");
      if (done == 0 && seconds() > deadline_seconds && !r.timed_out) {
        r.timed_out = true;
        kill(-pid_, SIGCONT);
        kill(-pid_, SIGKILL);
      }
      if (done == 0) usleep(20000);
    }
    finished_ = true;
    r.seconds = seconds();
    if (r.timed_out) kill(-pid_, SIGKILL);  // any rank the launcher left behind
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = read_text(out_path());
    r.raw_err = read_text(err_path());
    r.err = unstamped(r.raw_err);
    return r;
  }

 private:
  TempDir io_{"io"};
  std::chrono::steady_clock::time_point t0_;
  std::string command_;
  pid_t pid_ = 0;
  bool finished_ = false;
};

inline RunResult run_program(std::vector<std::string> argv_s, double deadline_seconds = 0) {
  return Started(std::move(argv_s)).finish(deadline_seconds);
}

// The CPU tests train on the CPU also where a GPU is visible (--device auto would take it):
// a training command without a --device of its own gets --device cpu. The subcommands that
// train nothing are left as they are.
inline std::vector<std::string> on_cpu_unless_told(std::vector<std::string> args) {
  if (!args.empty() && (args[0] == "evaluate" || args[0] == "inspect" || args[0] == "export" ||
                         args[0] == "clean-snapshots" || args[0] == "persist-snapshot"))
    return args;
  for (const auto& a : args)
    if (a == "--device" || a.rfind("--device=", 0) == 0) return args;
  // In front, so that a trailing option left without its value stays the last word.
  const auto at = args.begin() + (!args.empty() && args[0] == "train" ? 1 : 0);
  args.insert(at, {"--device", "cpu"});
  return args;
}

inline std::vector<std::string> hpctrain_argv(const std::vector<std::string>& args) {
  std::vector<std::string> argv{hpctrain_binary()};
  const auto a = on_cpu_unless_told(args);
  argv.insert(argv.end(), a.begin(), a.end());
  return argv;
}

// Runs hpctrain with `args` (killed after deadline_seconds when that is > 0).
inline RunResult run_hpctrain(const std::vector<std::string>& args, double deadline_seconds = 0) {
  return run_program(hpctrain_argv(args), deadline_seconds);
}

// Runs hpctrain where permission bits stop it. As root (CI runs the tests as root, whom mode
// 000 does not stop) it runs through setpriv without the two capabilities that let root past
// them, so that the tests of unreadable files run everywhere instead of being skipped.
inline RunResult run_hpctrain_without_override(const std::vector<std::string>& args, double deadline_seconds = 60) {
  std::vector<std::string> argv;
  if (geteuid() == 0)
    argv = {"/usr/bin/setpriv", "--inh-caps=-dac_override,-dac_read_search",
            "--bounding-set=-dac_override,-dac_read_search"};
  const auto a = hpctrain_argv(args);
  argv.insert(argv.end(), a.begin(), a.end());
  return run_program(std::move(argv), deadline_seconds);
}

// Starts hpctrain with `args` in the background.
inline std::unique_ptr<Started> start_hpctrain(const std::vector<std::string>& args) {
  return std::make_unique<Started>(hpctrain_argv(args));
}

// Polls `done` every 5 ms for up to `seconds`; whether it came true.
inline bool wait_until(const std::function<bool()>& done, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    usleep(5000);
  }
  return true;
}

// Whether process `pid` blocks signal `sig` in its main thread (/proc/PID/status, SigBlk): for
// hpctrain, that its code runs and a stop signal is taken by its signal thread, not by the
// default action.
inline bool blocks_signal(pid_t pid, int sig) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("SigBlk:", 0) == 0) return (std::stoull(line.substr(7), nullptr, 16) >> (sig - 1)) & 1;
  return false;
}

// The processes whose parent is `pid` (mpirun's ranks), from /proc.
inline std::vector<pid_t> child_pids(pid_t pid) {
  std::vector<pid_t> children;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "stat");
    std::string stat;
    std::getline(in, stat);
    const size_t paren = stat.rfind(')');  // the command may hold spaces and parentheses
    if (paren == std::string::npos) continue;
    std::istringstream rest(stat.substr(paren + 1));
    std::string state;
    pid_t parent = 0;
    if (rest >> state >> parent && parent == pid) children.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return children;
}

// ---- MPI ---------------------------------------------------------------------------------------

inline std::string mpiexec() { return HPCTRAIN_MPIEXEC; }

// One mpirun of several groups of ranks (MPMD: "-np 1 A : -np 1 B"); each group is (ranks,
// hpctrain's arguments).
inline std::vector<std::string> mpi_argv(const std::vector<std::pair<int, std::vector<std::string>>>& groups,
                                         bool no_kill_delay = false) {
  // CI runs as root; Open MPI refuses that unless told. --oversubscribe: 4 ranks on 2 cores.
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  // Containers often have a tiny /dev/shm; the shared-memory transport can use /tmp.
  setenv("OMPI_MCA_btl_vader_backing_directory", "/tmp", 0);
  // A rank waiting in MPI yields its core: ctest -j2 runs another test beside, and ranks spinning
  // in an all-reduce took the cores from the ranks they waited for.
  std::vector<std::string> argv{mpiexec(), "--oversubscribe", "--bind-to", "none", "--mca", "mpi_yield_when_idle", "1"};
  if (no_kill_delay) argv.insert(argv.end(), {"--mca", "odls_base_sigkill_timeout", "0"});
  for (size_t g = 0; g < groups.size(); ++g) {
    if (g > 0) argv.push_back(":");
    argv.insert(argv.end(), {"-np", std::to_string(groups[g].first), hpctrain_binary()});
    const auto a = on_cpu_unless_told(groups[g].second);
    argv.insert(argv.end(), a.begin(), a.end());
  }
  return argv;
}

// When a rank exits with another code than 0 (a stop's 75, an error's 2), or mpirun is sent
// SIGTERM, Open MPI's daemon sends the job's processes SIGCONT, sleeps odls_base_sigkill_timeout
// (1 s), sends SIGTERM, sleeps again and sends SIGKILL, even when no process is left: 2 s of
// nothing in each such run. run_mpi skips the sleeps. A rank that ends as its peers do can only be
// behind their exit after MPI_Finalize, which waits for every rank, and its outcome is final then:
// the SIGTERM ends it at once with its code, quietly
// (MpiTraining.ARankEndingAfterItsPeerIsEndedQuietly); one that fails alone ends the job anyway. A job
// whose mpirun the test signals (start_mpi) keeps the default, which gives the ranks the time to
// checkpoint, as in production.
inline RunResult run_mpi(const std::vector<std::pair<int, std::vector<std::string>>>& groups,
                         double deadline_seconds = 0) {
  return run_program(mpi_argv(groups, true), deadline_seconds);
}

inline RunResult run_mpi(int ranks, const std::vector<std::string>& args, double deadline_seconds = 0) {
  return run_mpi({{ranks, args}}, deadline_seconds);
}

// A job that every rank must refuse before it trains (a bad option, ranks that disagree, data that
// cannot be read), with a deadline of its own. Planted: every rank printing the error line still
// failed the one-line checks (3 of 3 runs).
inline RunResult run_mpi_refused(const std::vector<std::pair<int, std::vector<std::string>>>& groups) {
  return run_mpi(groups, 120);
}

inline RunResult run_mpi_refused(int ranks, const std::vector<std::string>& args) {
  return run_mpi_refused({{ranks, args}});
}

// Starts mpirun with `ranks` ranks of hpctrain `args` in the background. no_kill_delay: as
// run_mpi, for a job the test watches but does not signal.
inline std::unique_ptr<Started> start_mpi(int ranks, const std::vector<std::string>& args, bool no_kill_delay = false) {
  return std::make_unique<Started>(mpi_argv({{ranks, args}}, no_kill_delay));
}

inline int count_of(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// How many lines of `err` hpctrain wrote (mpirun's own are not its).
inline int hpctrain_lines(const std::string& err) {
  int n = 0;
  for (const std::string& line : lines_of(err)) n += line.rfind("hpctrain: ", 0) == 0 || line.rfind("hpctrain[", 0) == 0;
  return n;
}

// ---- IDX files -------------------------------------------------------------------------------

using Bytes = std::vector<uint8_t>;

inline void put_be32(Bytes& b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(v >> s));
}

// n images of rows x cols: a pattern that depends on the label, so a model can learn it.
inline Bytes idx_images(uint32_t n, uint32_t rows = 28, uint32_t cols = 28, uint32_t magic = 0x803) {
  Bytes b;
  put_be32(b, magic);
  put_be32(b, n);
  put_be32(b, rows);
  put_be32(b, cols);
  for (uint32_t i = 0; i < n; ++i)
    for (uint32_t p = 0; p < rows * cols; ++p) b.push_back(static_cast<uint8_t>(((p % cols) * 9 + (i % 10) * 25 + p / cols) & 0xff));
  return b;
}

inline Bytes idx_labels(uint32_t n, uint32_t magic = 0x801) {
  Bytes b;
  put_be32(b, magic);
  put_be32(b, n);
  for (uint32_t i = 0; i < n; ++i) b.push_back(static_cast<uint8_t>(i % 10));
  return b;
}

inline void write_bytes(const std::string& path, const Bytes& b) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

inline void write_gzip(const std::string& path, const Bytes& b) {
  gzFile f = gzopen(path.c_str(), "wb");
  if (!f || gzwrite(f, b.data(), static_cast<unsigned>(b.size())) != static_cast<int>(b.size()) || gzclose(f) != Z_OK)
    throw std::runtime_error("cannot write " + path);
}

// DIR/lock held as a live run on another host holds a checkpoint directory's lock (ckpt/dir_lock.hpp):
// an OFD write lock on the file, a fresh record naming host "elsewhere", pid 1. The descriptor:
// closing it lets the lock go (the file stays).
inline int hold_directory_lock(const std::string& dir) {
  const int fd = ::open((dir + "/lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  struct flock l {};
  l.l_type = F_WRLCK;
  const std::string record = "host=elsewhere\npid=1\nunix_time=" + std::to_string(::time(nullptr)) + "\nstate=held\n";
  if (fd < 0 || ::fcntl(fd, F_OFD_SETLK, &l) != 0 ||
      ::write(fd, record.data(), record.size()) != static_cast<ssize_t>(record.size()))
    throw std::runtime_error("cannot hold " + dir + "/lock");
  return fd;
}

inline Bytes read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

// An IDX image file of n 28x28 images: the first `patterned` as idx_images makes them, the rest
// zeros left as a hole in the file (sparse: the published 60000 cost the disk nothing).
inline void write_idx_images(const std::string& path, uint32_t n, uint32_t patterned) {
  Bytes b = idx_images(patterned);
  for (int i = 0; i < 4; ++i) b[4 + i] = static_cast<uint8_t>(n >> (24 - 8 * i));  // the header's count
  write_bytes(path, b);
  fs::resize_file(path, 16 + uintmax_t{n} * 28 * 28);
}

// The four Fashion-MNIST files, uncompressed, in `dir`, as small as hpctrain takes them: the
// published 60000 training and 10000 test samples (data::kIdxTrainRecords, kIdxTestRecords), of
// which the first 64 and 16 hold a pattern and the rest are black.
inline void write_small_fashion_mnist(const std::string& dir) {
  write_idx_images(dir + "/train-images-idx3-ubyte", 60000, 64);
  write_bytes(dir + "/train-labels-idx1-ubyte", idx_labels(60000));
  write_idx_images(dir + "/t10k-images-idx3-ubyte", 10000, 16);
  write_bytes(dir + "/t10k-labels-idx1-ubyte", idx_labels(10000));
}

// CIFAR-10 in `dir` as published: five training batches and a test batch of 10000 records
// (a label byte, then 32x32 red, green and blue planes) each. The first `patterned` records of
// each file hold a pattern of the file, the record and the pixel (so random crops and flips
// change what a model sees, and no two files are alike); the rest are sparse zeros.
inline void write_cifar10(const std::string& dir, uint32_t patterned) {
  constexpr uintmax_t kRecord = 3073, kRecords = 10000;
  const std::vector<std::string> names{"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin",
                                       "data_batch_4.bin", "data_batch_5.bin", "test_batch.bin"};
  for (uint32_t f = 0; f < names.size(); ++f) {
    Bytes b;
    b.reserve(patterned * kRecord);
    for (uint32_t r = 0; r < patterned; ++r) {
      const uint32_t label = (r * 7 + f) % 10;
      b.push_back(static_cast<uint8_t>(label));
      for (uint32_t p = 0; p < 3072; ++p)
        b.push_back(static_cast<uint8_t>((p * 13 + r * 31 + f * 57 + (p / 96) * label * 5) * 7));
    }
    const std::string path = dir + "/" + names[f];
    write_bytes(path, b);
    fs::resize_file(path, kRecord * kRecords);
  }
}

// ---- Nothing changed -------------------------------------------------------------------------

// One path as a refused run must leave it: type and permissions, size, modification time and
// a CRC-32 of a file's bytes ("absent" when there is nothing). A directory's own times are left
// out: a file made and removed again changes them, and its entries are compared one by one.
inline std::string describe_path(const fs::path& p) {
  struct stat st {};
  if (::lstat(p.c_str(), &st) != 0) return "absent";
  std::ostringstream d;
  d << std::oct << st.st_mode << std::dec;
  if (S_ISDIR(st.st_mode)) return d.str();
  d << ' ' << st.st_size << " bytes, modified " << st.st_mtim.tv_sec << '.' << st.st_mtim.tv_nsec;
  if (!S_ISREG(st.st_mode)) return d.str();
  std::ifstream in(p, std::ios::binary);
  uLong crc = crc32(0L, Z_NULL, 0);
  std::vector<char> buf(1 << 16);
  while (in.read(buf.data(), static_cast<std::streamsize>(buf.size())) || in.gcount() > 0)
    crc = crc32(crc, reinterpret_cast<const Bytef*>(buf.data()), static_cast<uInt>(in.gcount()));
  d << ", crc " << std::hex << crc << (in.bad() ? " (unreadable)" : "");
  return d.str();
}

// Everything under root (root itself as "."), path by path: equal snapshots taken before and
// after a run show that it changed nothing there.
using Snapshot = std::map<std::string, std::string>;
inline Snapshot snapshot(const std::string& root) {
  Snapshot s{{".", describe_path(root)}};
  std::error_code ec;
  for (fs::recursive_directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec))
    s[fs::relative(it->path(), root).string()] = describe_path(it->path());
  return s;
}

// The same for several roots at once.
inline std::vector<Snapshot> snapshots(const std::vector<std::string>& roots) {
  std::vector<Snapshot> all;
  for (const auto& r : roots) all.push_back(snapshot(r));
  return all;
}

// ---- JSON Lines ------------------------------------------------------------------------------

// One value of a flat JSON object. `raw` keeps the token, to tell 3 from 3.0.
struct JsonValue {
  enum Type { Null, Bool, Number, String } type = Null;
  double number = 0;
  bool boolean = false;
  std::string str, raw;
  bool is_integer() const { return type == Number && raw.find_first_of(".eE") == std::string::npos; }
};
using JsonObject = std::map<std::string, JsonValue>;

// Parses one line holding one flat JSON object (the metrics file has no nesting); throws on
// anything that is not strictly valid JSON, including duplicate keys and trailing text.
class FlatJsonParser {
 public:
  explicit FlatJsonParser(const std::string& s) : s_(s) {}
  JsonObject parse() {
    JsonObject obj;
    ws();
    expect('{');
    ws();
    if (peek() == '}') {
      ++i_;
    } else {
      for (;;) {
        ws();
        std::string key = string_token();
        ws();
        expect(':');
        ws();
        JsonValue v = value();
        if (!obj.emplace(key, v).second) fail("duplicate key " + key);
        ws();
        if (peek() == ',') {
          ++i_;
          continue;
        }
        expect('}');
        break;
      }
    }
    ws();
    if (i_ != s_.size()) fail("text after the object");
    return obj;
  }

 private:
  [[noreturn]] void fail(const std::string& why) {
    throw std::runtime_error("invalid JSON (" + why + ") at " + std::to_string(i_) + " in: " + s_);
  }
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t')) ++i_;
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++i_;
  }
  std::string string_token() {
    expect('"');
    std::string out;
    for (;;) {
      if (i_ >= s_.size()) fail("unterminated string");
      const char c = s_[i_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      const char e = peek();
      ++i_;
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          if (i_ + 4 > s_.size()) fail("short \\u escape");
          const std::string hex = s_.substr(i_, 4);
          for (char h : hex)
            if (!std::isxdigit(static_cast<unsigned char>(h))) fail("bad \\u escape");
          out += static_cast<char>(std::stoi(hex, nullptr, 16));  // ASCII is all the metrics use
          i_ += 4;
          break;
        }
        default: fail("bad escape");
      }
    }
  }
  JsonValue value() {
    JsonValue v;
    const char c = peek();
    if (c == '"') {
      v.type = JsonValue::String;
      v.str = string_token();
      return v;
    }
    for (const char* word : {"null", "true", "false"}) {
      const std::string w(word);
      if (s_.compare(i_, w.size(), w) == 0) {
        i_ += w.size();
        v.raw = w;
        v.type = w == "null" ? JsonValue::Null : JsonValue::Bool;
        v.boolean = w == "true";
        return v;
      }
    }
    // Number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
    const size_t start = i_;
    auto digits = [&] {
      const size_t from = i_;
      while (std::isdigit(static_cast<unsigned char>(peek()))) ++i_;
      if (i_ == from) fail("expected a digit");
    };
    if (peek() == '-') ++i_;
    if (peek() == '0') {
      ++i_;
    } else {
      digits();
    }
    if (peek() == '.') {
      ++i_;
      digits();
    }
    if (peek() == 'e' || peek() == 'E') {
      ++i_;
      if (peek() == '+' || peek() == '-') ++i_;
      digits();
    }
    v.type = JsonValue::Number;
    v.raw = s_.substr(start, i_ - start);
    v.number = std::strtod(v.raw.c_str(), nullptr);
    return v;
  }

  const std::string& s_;
  size_t i_ = 0;
};

// Every line of a JSON Lines file, parsed.
inline std::vector<JsonObject> read_all_json_lines(const std::string& path) {
  std::vector<JsonObject> out;
  for (const std::string& line : lines_of(read_text(path))) out.push_back(FlatJsonParser(line).parse());
  return out;
}

// A metrics file's events without the config event that starts each run (train_test checks
// that one): the training's epoch, step, stopped and done events, and any foreign line.
inline std::vector<JsonObject> read_json_lines(const std::string& path) {
  std::vector<JsonObject> out;
  for (JsonObject& o : read_all_json_lines(path))
    if (!o.count("event") || o.at("event").str != "config") out.push_back(std::move(o));
  return out;
}

// The run's done event, which must be the last metrics line: a test failure and an empty
// object when it is not there.
inline const JsonObject& done_line(const std::vector<JsonObject>& lines) {
  static const JsonObject none;
  if (lines.empty() || lines.back().at("event").str != "done") {
    ADD_FAILURE() << "no done line last";
    return none;
  }
  return lines.back();
}

// The done event of a metrics file (a copy: the file's lines are gone after the call).
inline JsonObject done_of(const std::string& metrics) {
  SCOPED_TRACE(metrics);
  return done_line(read_json_lines(metrics));
}

// A run's done line `got` ends exactly where `want` does: the same parameters and the same whole
// state (momentum, batch-norm statistics, position), and so the same evaluation: every rank
// evaluates its part of the test set with its own batch-norm statistics, which must all be the
// ones the state holds.
inline void expect_same_end(const JsonObject& got, const JsonObject& want) {
  ASSERT_TRUE(got.count("state_checksum") && want.count("state_checksum"));
  EXPECT_EQ(got.at("param_checksum").str, want.at("param_checksum").str);
  EXPECT_EQ(got.at("state_checksum").str, want.at("state_checksum").str);
  EXPECT_EQ(got.at("test_loss").number, want.at("test_loss").number);
  EXPECT_EQ(got.at("test_accuracy").number, want.at("test_accuracy").number);
}

// The epoch events of a metrics file by epoch (1, 2, ...): those the runs that wrote it ended.
inline std::map<int64_t, JsonObject> epochs_of(const std::string& metrics) {
  std::map<int64_t, JsonObject> epochs;
  for (JsonObject& o : read_json_lines(metrics))
    if (o.count("event") && o.at("event").str == "epoch") epochs[std::llround(o.at("epoch").number)] = std::move(o);
  return epochs;
}

// The epoch numbers of a metrics file's epoch events in the order written: an epoch ended twice
// (by a run and by the one resumed after it) shows twice, where epochs_of keeps one.
inline std::vector<double> epoch_numbers(const std::string& metrics) {
  std::vector<double> epochs;
  for (const JsonObject& line : read_all_json_lines(metrics))
    if (line.at("event").str == "epoch") epochs.push_back(line.at("epoch").number);
  return epochs;
}

// A resumed run's epochs report what an uninterrupted run's do: the training figures over all of
// the epoch's steps (those before the resume too), bit for bit, and the evaluation.
inline void expect_same_epochs(const std::map<int64_t, JsonObject>& got, const std::map<int64_t, JsonObject>& want) {
  ASSERT_FALSE(want.empty());
  for (const auto& [epoch, w] : want) {
    SCOPED_TRACE(::testing::Message() << "epoch " << epoch);
    ASSERT_TRUE(got.count(epoch));
    for (const char* key : {"step", "train_loss", "train_accuracy", "test_loss", "test_accuracy"})
      EXPECT_EQ(got.at(epoch).at(key).raw, w.at(key).raw) << key;
  }
}

// How a run ended: its done line and its epoch events.
struct Ended {
  JsonObject done;
  std::map<int64_t, JsonObject> epochs;
};

// A job never interrupted, on `ranks` ranks: the reference that an interrupted and resumed run
// must match bit for bit. `job(metrics)` gives the job's arguments with its metrics file; the run
// writes `metrics`. Worked out once per process for each number of ranks and job.
inline const Ended& uninterrupted_end(int ranks, const std::function<std::vector<std::string>(const std::string&)>& job,
                                      const std::string& metrics) {
  static std::map<std::pair<int, std::vector<std::string>>, Ended> known;
  const auto key = std::make_pair(ranks, job(""));  // the job, wherever its metrics go
  if (const auto it = known.find(key); it != known.end()) return it->second;
  const RunResult r = run_mpi(ranks, job(metrics));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return known[key] = Ended{done_of(metrics), epochs_of(metrics)};
}

}  // namespace hpc::itest

#include "ckpt/dir_lock.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <ctime>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "core/error.hpp"
#include "core/file_identity.hpp"
#include "core/log.hpp"

namespace hpc::ckpt {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;

constexpr double kDefaultStaleSeconds = 30;
constexpr double kPollSeconds = 0.2;  // how often a waiter looks again
// The lock file is this user's alone to open, whatever the umask. A lock others may open, if only
// to read, is one they may lock (a read lock blocks the write lock): another user held a crashed
// run's leftover lock file from the moment its holder died, and the relaunch (hpcrun's next
// attempt, a requeued job) was refused at once as "in use by another run", exit 2, its job ended.
constexpr mode_t kLockMode = 0600;

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string host_name() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

// A write lock on the whole file, owned by the open file description (see the header): true when
// taken, false when another holds it.
bool try_lock(int fd, const std::string& path) {
  const FileLock got = lock_whole_file(fd);
  if (got == FileLock::Failed) io_error("lock", path);
  return got == FileLock::Taken;
}

// Whether fd is the file `path` names: Unknown when a stat failed for another reason than the
// name's absence (EIO, ESTALE, ELOOP).
enum class Named { Yes, No, Unknown };
Named names(int fd, const std::string& path) {
  struct stat a {}, b {};
  if (::fstat(fd, &a) != 0) return Named::Unknown;
  if (::stat(path.c_str(), &b) != 0) return errno == ENOENT || errno == ENOTDIR ? Named::No : Named::Unknown;
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino ? Named::Yes : Named::No;
}

bool same_inode(int fd, const std::string& path) { return names(fd, path) == Named::Yes; }

std::string describe(const std::map<std::string, std::string>& r);
// The lock this process holds, for remove_lock_at_exit(): a fixed buffer and the descriptor,
// since a process ending at once may read them (set and cleared by the lock's owner).
char g_lock_path[4096];
std::atomic<int> g_lock_fd{-1};
// remove_lock_at_exit() removed it: its absence is this process's doing, not another run's.
std::atomic<bool> g_removed_at_exit{false};

// Why a lock is no longer this process's: another run's record in it now, or none left.
std::string how_lost(const std::string& path) {
  if (g_removed_at_exit.load() && path == g_lock_path)
    return "this process removed its lock file as it ends (its watchdog, or a stop at once)";
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 && errno != ENOENT && errno != ENOTDIR)
    return std::string("its lock file could not be looked at for a third of the stale time (") + std::strerror(errno) +
           "), and another run may take the directory over";
  std::error_code ec, ec2;
  if (!fs::exists(fs::path(path).parent_path(), ec) && !ec) return "the directory was removed while this run trained";
  if (!fs::exists(path, ec2) && !ec2)
    return "its lock file is gone (another run took the directory over and has ended since, or the file was deleted)";
  return "taken over by " + describe(read_key_values(path)) +
         " (this process was stopped or cut off, and another run took the directory over)";
}

std::string describe(const std::map<std::string, std::string>& r) {
  auto get = [&](const char* k) {
    const auto it = r.find(k);
    return it == r.end() || it->second.empty() ? std::string("?") : it->second;
  };
  if (r.empty()) return std::string("another run (whose lock file is gone now)");
  std::string s = "host " + get("host") + " pid " + get("pid");
  if (r.count("run_id")) s += ", run " + get("run_id");
  if (const auto it = r.find("since"); it != r.end()) {
    const time_t t = std::strtoll(it->second.c_str(), nullptr, 10);
    char when[32] = "?";
    struct tm utc {};
    if (gmtime_r(&t, &utc)) std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &utc);
    s += std::string(", since ") + when;
  }
  return s;
}

std::optional<int64_t> number(const std::map<std::string, std::string>& r, const char* key) {
  const auto it = r.find(key);
  if (it == r.end()) return std::nullopt;
  char* end = nullptr;
  const long long v = std::strtoll(it->second.c_str(), &end, 10);
  if (end == it->second.c_str() || *end) return std::nullopt;
  return v;
}

std::string record_text(const std::map<std::string, std::string>& r) {
  std::string text;
  for (const char* k : {"host", "pid", "run_id", "hpcrun_token", "hpcrun_attempt", "since", "unix_time", "state"})
    if (const auto it = r.find(k); it != r.end()) text += std::string(k) + '=' + it->second + '\n';
  return text;
}

double steady_seconds() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

// Watches a busy lock's record: stale once it has not changed for stale_seconds by this
// process's clock, and its unix_time is as old by this host's (two clocks: a holder whose clock
// runs behind is not taken for dead, nor one seen for only a moment).
class HolderWatch {
 public:
  explicit HolderWatch(std::string path) : watch_(std::move(path)) {}
  const std::map<std::string, std::string>& look() { return watch_.look(steady_seconds()); }
  double unchanged_for() const { return watch_.unchanged_for(steady_seconds()); }
  bool stale() const { return unchanged_for() >= DirectoryLock::stale_seconds() && looks_stale(true); }
  // Whether the record already looks stale by its own time, worth watching for stale_seconds
  // even past the wait (`untimed`: a record without a unix_time counts as such).
  bool looks_stale(bool untimed = false) const {
    const std::optional<int64_t> t = number(watch_.record(), "unix_time");
    return t ? static_cast<double>(unix_now() - *t) >= DirectoryLock::stale_seconds() : untimed;
  }

 private:
  RecordWatch watch_;
};

// Writes a new lock file, locked, and renames it over `path`: the stale holder keeps its lock on
// a file no longer named there. The fd of the new lock.
int take_over(const std::string& path) {
  const std::string tmp = path + ".new." + host_name() + "." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, kLockMode);
  if (fd < 0) io_error("create", tmp);
  if (!try_lock(fd, tmp) || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    errno = error;
    io_error("take over the lock", path);
  }
  return fd;
}

}  // namespace

std::string describe_lock_holder(const std::map<std::string, std::string>& record) { return describe(record); }

const std::map<std::string, std::string>& RecordWatch::look(double now) {
  auto record = read_key_values(path_);
  if (record != last_ || !seen_) {
    last_ = std::move(record);
    changed_ = now;
    seen_ = true;
  }
  return last_;
}

void remove_lock_at_exit() {
  const int fd = g_lock_fd.load();
  if (fd < 0 || !same_inode(fd, g_lock_path)) return;
  g_removed_at_exit.store(true);  // before the unlink: the refresher may look at once
  ::unlink(g_lock_path);
}

bool lock_lost_at_exit() {
  const int fd = g_lock_fd.load();
  return fd >= 0 && !same_inode(fd, g_lock_path);
}

double DirectoryLock::stale_seconds() {
  const char* v = std::getenv("HPCTRAIN_TEST_LOCK_STALE_SECONDS");
  return v && std::atof(v) > 0 ? std::atof(v) : kDefaultStaleSeconds;
}

std::string read_small_file(const std::string& path) {
  // Not blocking at the open: a FIFO of that name would wait for a writer forever.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return "";
  struct stat st {};
  std::string text;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
    text.resize(kMostKeyValueBytes);
    size_t got = 0;
    for (ssize_t n; got < text.size() && (n = ::read(fd, text.data() + got, text.size() - got)) != 0;)
      if (n > 0) got += static_cast<size_t>(n);
      else if (errno != EINTR) break;
    text.resize(got);
  }
  ::close(fd);
  return text;
}

std::map<std::string, std::string> read_key_values(const std::string& path) {
  std::map<std::string, std::string> fields;
  std::istringstream in(read_small_file(path));
  for (std::string line; std::getline(in, line);) {
    const size_t eq = line.find('=');
    const bool printable = std::none_of(line.begin(), line.end(), [](char c) { return std::iscntrl(static_cast<unsigned char>(c)); });
    if (eq != std::string::npos && printable) fields[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return fields;
}

namespace {
// The folders of DIR's path that are not there yet, in the order they would be made ("new/./a/../b":
// new, new/./a, new/./a/../b, which is new/b).
std::vector<std::string> folders_to_make(const std::string& dir) {
  std::error_code ec;
  const fs::path whole = fs::absolute(dir, ec);
  std::vector<std::string> made;
  fs::path at;
  for (const fs::path& part : whole) {
    at /= part;
    if (ec || part.empty() || part == "." || part == "..") continue;
    if (!fs::exists(at, ec) && !ec) made.push_back(at.string());
  }
  return made;
}
}  // namespace

std::unique_ptr<DirectoryLock> DirectoryLock::acquire(const std::string& dir, double wait_seconds,
                                                      const std::function<bool()>& stop,
                                                      const std::map<std::string, std::string>& owner) {
  std::error_code ec;
  // One not there yet is judged by the folders above it before it is made (it was made, then refused).
  std::vector<std::string> made = folders_to_make(dir);
  if (!made.empty()) require_safe_directory(dir, "--checkpoint-dir");
  make_directories(dir, kSharedDirectoryMode, ec);  // never others' to write in, whatever the umask
  HPC_REQUIRE(!ec && fs::is_directory(dir), "cannot create checkpoint directory ", dir,
              ec ? ": " + ec.message() : std::string(": not a directory"));
  require_safe_directory(dir, "--checkpoint-dir");  // before anything in it is read or written
  const std::string path = (fs::path(dir) / "lock").string();
  const auto deadline = Clock::now() + std::chrono::duration<double>(wait_seconds);
  HolderWatch holder(path);
  bool said = false;
  for (;;) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, kLockMode);
    if (fd < 0) io_error("open", path);
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      usage_error("the checkpoint directory's lock ", path, " is not a regular file (a FIFO or device of that name?): ",
                  "remove it");
    }
    // One an earlier hpctrain left 0644 (a crashed run's): others' bits go before it is locked.
    if ((st.st_mode & 077) != 0 && st.st_uid == ::geteuid()) ::fchmod(fd, kLockMode);
    if (try_lock(fd, path)) {
      if (same_inode(fd, path)) {  // else taken over between the open and the lock: look again
        const auto left = read_key_values(path);
        if (!left.empty() && left.count("state") && left.at("state") != "released")
          log::warn("the checkpoint directory's lock ", path, " was left by ", describe(left),
                    ", which ended without releasing it; taking it");
        return std::unique_ptr<DirectoryLock>(new DirectoryLock(dir, fd, std::move(made), owner));
      }
      ::close(fd);
      continue;
    }
    ::close(fd);
    const auto& record = holder.look();
    if (holder.stale()) {
      log::warn("taking over the checkpoint directory's lock ", path, " from ", describe(record),
                ": its record has not changed for ", static_cast<int64_t>(holder.unchanged_for()),
                " s (its host lost, or the process stopped); it writes nothing more there if it comes back");
      return std::unique_ptr<DirectoryLock>(new DirectoryLock(dir, take_over(path), {}, owner));
    }
    // A record that looks stale by its own time is watched for stale_seconds past the wait, no
    // longer: a live holder whose clock runs behind rewrites it (never stale()), and the waiter,
    // refusing at once by default, waited for ever (or for --start-timeout).
    const auto grace = std::chrono::duration<double>(stale_seconds() + kPollSeconds);
    const bool waiting = Clock::now() < deadline || (holder.looks_stale() && Clock::now() < deadline + grace);
    HPC_REQUIRE(waiting, "checkpoint directory ", dir, " is in use by another run (", describe(record),
                "): one run writes a directory at a time; wait for it to end, or give this run another "
                "--checkpoint-dir (--checkpoint-lock-wait waits for it)");
    if (!said && wait_seconds > 0) {
      log::info("waiting up to ", wait_seconds, " s for the checkpoint directory's lock, held by ",
                describe(record));
      said = true;
    }
    if (stop && stop()) return nullptr;
    std::this_thread::sleep_for(std::chrono::duration<double>(kPollSeconds));
  }
}

DirectoryLock::DirectoryLock(const std::string& dir, int fd, std::vector<std::string> made,
                             const std::map<std::string, std::string>& owner)
    : dir_(dir), path_((fs::path(dir) / "lock").string()), fd_(fd), made_(std::move(made)), record_(owner) {
  record_.insert({{"host", host_name()}, {"pid", std::to_string(::getpid())}, {"since", std::to_string(unix_now())}});
  write_record("held");
  refresher_ = std::thread([this] { refresh_loop(); });
  if (path_.size() < sizeof g_lock_path) {
    std::memcpy(g_lock_path, path_.c_str(), path_.size() + 1);
    g_removed_at_exit.store(false);  // (a process's earlier lock's, in tests)
    g_lock_fd.store(fd_);
  }
}

DirectoryLock::~DirectoryLock() { release(false); }

void DirectoryLock::release(bool remove_made_directory) {
  if (released_) return;
  released_ = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  refresher_.join();
  g_lock_fd.store(-1);
  // Removed while locked: a process that opened it meanwhile locks a file no longer named there,
  // which acquire() notices (same_inode) and opens the path again.
  if (held()) ::unlink(path_.c_str());
  ::close(fd_);  // drops the lock
  if (!remove_made_directory) return;
  // The last made first, each only while empty (rmdir refuses any other, and the ones above it).
  for (auto at = made_.rbegin(); at != made_.rend() && ::rmdir(at->c_str()) == 0; ++at) {
  }
}

std::string DirectoryLock::how_lost() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (lost_to_.empty()) lost_to_ = hpc::ckpt::how_lost(path_);
  return lost_to_;
}

bool DirectoryLock::held() const {
  if (lost_.load()) return false;
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  switch (names(fd_, path_)) {
    case Named::Yes: unknown_since_ns_.store(0); return true;
    case Named::No: return false;
    case Named::Unknown: break;
  }
  // One failed stat marked the lock lost for good, and the run ended without its checkpoint. No
  // other run can take it over meanwhile: the record, rewritten through fd_, is not stale.
  int64_t since = 0;
  if (unknown_since_ns_.compare_exchange_strong(since, now)) since = now;
  return static_cast<double>(now - since) * 1e-9 < stale_seconds() / 3;
}

void DirectoryLock::set_run_id(const std::string& id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    record_["run_id"] = id;
  }
  write_record("held");
}

void DirectoryLock::require_held() const {
  if (held()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (lost_to_.empty()) lost_to_ = hpc::ckpt::how_lost(path_);
  lost_.store(true);
  usage_error("this run lost the checkpoint directory's lock ", path_, ": ", lost_to_, "; writing nothing more there");
}

void DirectoryLock::write_record(const char* state) {
  std::string text;
  {
    std::lock_guard<std::mutex> lock(mu_);
    record_["unix_time"] = std::to_string(unix_now());
    record_["state"] = state;
    text = record_text(record_);
  }
  // One write at offset 0, then the length: a reader sees the old or the new record, or a torn one
  // that parses to other fields (never taken for stale: its text changed).
  if (::pwrite(fd_, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size()) ||
      ::ftruncate(fd_, static_cast<off_t>(text.size())) != 0)
    log::warn("cannot update the checkpoint directory's lock ", path_, ": ", std::strerror(errno));
  ::fdatasync(fd_);  // on NFS, what another host reads comes from the server
}

void DirectoryLock::refresh_loop() {
  const auto period = std::chrono::duration<double>(stale_seconds() / 15);  // 2 s by default
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, period, [this] { return stop_; })) {
    lock.unlock();
    if (!held()) {
      const std::string how = hpc::ckpt::how_lost(path_);
      lock.lock();
      lost_to_ = how;
      lost_.store(true);
      if (g_removed_at_exit.load()) return;  // the process ends: nothing to warn of
      log::warn("the checkpoint directory's lock ", path_, " is no longer this run's: ", how,
                "; this run writes nothing more there");
      return;
    }
    write_record("held");
    lock.lock();
  }
}

}  // namespace hpc::ckpt

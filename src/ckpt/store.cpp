#include "ckpt/store.hpp"

#include <fcntl.h>
#include <stdio.h>  // renameat2
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <new>
#include <optional>
#include <utility>

#include "ckpt/dir_lock.hpp"
#include "core/error.hpp"
#include "core/file_identity.hpp"
#include "core/log.hpp"
#include "core/signal_safe_text.hpp"

namespace hpc::ckpt {
namespace fs = std::filesystem;
namespace {

constexpr const char* kPrefix = "ckpt-";
constexpr const char* kSuffix = ".hpck";
constexpr const char* kSpare = ".spare";

void write_all(int fd, const char* p, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w == 0) errno = ENOSPC;  // a write of nothing sets no errno: a full device, as the kernel means it
    if (w <= 0) io_error("write", path);
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void fsync_path(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags);
  if (fd < 0) io_error("open", path);
  const int rc = ::fsync(fd);
  const int fsync_errno = errno;
  ::close(fd);
  errno = fsync_errno;  // fsync's error, not close's, is the one reported
  if (rc != 0 && errno != EINVAL) io_error("fsync", path);  // some filesystems cannot sync directories
}

struct FileCloser {
  int fd;
  ~FileCloser() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

namespace {

// Whether `file` would be an entry of directory `dir`: by identity where both its folder and
// dir exist, else by their spelling made canonical as far as it exists.
bool in_directory(const std::string& file, const std::string& dir) {
  const fs::path parent = fs::path(file).has_parent_path() ? fs::path(file).parent_path() : fs::path(".");
  std::error_code e1, e2;
  if (fs::is_directory(parent, e1) && fs::is_directory(dir, e2)) return fs::equivalent(parent, dir, e1) && !e1;
  auto canonical = [](const fs::path& p, std::error_code& e) {
    const fs::path c = fs::weakly_canonical(p, e);
    return c.has_filename() ? c : c.parent_path();  // "dir/" is dir
  };
  const fs::path a = canonical(parent, e1), b = canonical(dir, e2);
  return !e1 && !e2 && a == b;
}

}  // namespace

void require_not_its_own_name(const NamedPath& output, const std::string& dir, const std::string& dir_what) {
  const std::string name = fs::path(output.path).filename().string();
  if (!output.path.empty() && checkpoint_dir_uses(name) && in_directory(output.path, dir))
    usage_error(output.what, " ", output.path, " is in ", dir_what, " under a name its own files take (", name,
                "): it would be replaced or moved away; choose another name");
}

std::string checkpoint_folder(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return path;
  fs::path file = fs::canonical(path, ec);
  if (ec) file = path;  // (not there, or unreadable: its reader names that)
  return file.has_parent_path() ? file.parent_path().string() : ".";
}

int64_t step_of(const std::string& name) {
  const size_t p = std::strlen(kPrefix), s = std::strlen(kSuffix);
  if (name.size() <= p + s || name.compare(0, p, kPrefix) != 0 || name.compare(name.size() - s, s, kSuffix) != 0)
    return -1;
  const char *first = name.data() + p, *last = name.data() + name.size() - s;
  int64_t step = -1;
  const auto [end, ec] = std::from_chars(first, last, step);
  return ec == std::errc() && end == last && *first != '-' ? step : -1;
}

int64_t newest_step(const std::string& dir) {
  const std::vector<std::string> all = list_checkpoints(dir);
  return all.empty() ? -1 : step_of(fs::path(all.front()).filename().string());
}

namespace {

// A checkpoint file's name must say the step it holds: --resume auto, evaluate DIR and retention
// go by the name, so a copy or rename under another step's name (ckpt-000000500.hpck holding step
// 10) would be preferred over newer states, or kept over them. Names of other forms say nothing.
void require_step_of_name(const Checkpoint& c, const std::string& path) {
  const int64_t named = step_of(fs::path(path).filename().string());
  if (named < 0 || !c.meta.count("step")) return;
  const int64_t held = c.integer("step");
  HPC_REQUIRE(held == named, "checkpoint ", path, " holds step ", held, ", not the step ", named,
              " its name says (copied or renamed from another checkpoint?)");
}

// Test hook (crash-consistency tests): seconds to sleep between writing the temporary file
// and renaming it, so a test can kill the writer there.
double pause_before_rename() {
  const char* v = std::getenv("HPCTRAIN_TEST_PAUSE_BEFORE_RENAME");
  return v ? std::atof(v) : 0.0;
}

// Test hook: HPCTRAIN_TEST_SLOW_WRITE=SECONDS[:CHUNKS] makes every write that reports its progress
// a slow file system's: its bytes in CHUNKS chunks (the size's own otherwise), SECONDS slept before
// each chunk's sync.
struct SlowWrite {
  double seconds = 0;
  uint64_t chunks = 0;
};
SlowWrite slow_write() {
  const char* v = std::getenv("HPCTRAIN_TEST_SLOW_WRITE");
  if (!v) return {};
  const char* colon = std::strchr(v, ':');
  return {std::atof(v), colon ? std::strtoull(colon + 1, nullptr, 10) : 0};
}

// pieces' bytes written in chunks, each synced (fdatasync) before progress counts it.
void write_synced_chunks(int fd, const std::vector<ByteSpan>& pieces, const std::string& path,
                         WriteProgress& progress) {
  uint64_t total = 0;
  for (const ByteSpan& p : pieces) total += p.size;
  const SlowWrite slow = slow_write();
  const uint64_t chunk = slow.chunks ? std::max<uint64_t>(1, (total + slow.chunks - 1) / slow.chunks)
                                     : WriteProgress::kSyncChunkBytes;
  progress.synced.store(0);
  progress.total.store(total);
  uint64_t synced = 0, unsynced = 0;
  const auto sync = [&] {
    if (slow.seconds > 0) std::this_thread::sleep_for(std::chrono::duration<double>(slow.seconds));
    if (::fdatasync(fd) != 0) io_error("fsync", path);
    synced += std::exchange(unsynced, 0);
    progress.synced.store(synced);
    progress.chunks.fetch_add(1);
  };
  for (const ByteSpan& p : pieces)
    for (size_t at = 0; at < p.size;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(p.size - at, chunk - unsynced));
      write_all(fd, p.data + at, n, path);
      at += n;
      unsynced += n;
      if (unsynced == chunk) sync();
    }
  if (unsynced > 0) sync();
}

// Test hook: HPCTRAIN_TEST_HOLD_BEFORE_RENAME=NAME:PATH holds the write of a file named NAME at
// the same point while PATH exists (a minute at most), for a test that acts there, however long a
// loaded machine takes it to see the temporary file, and then lets the write go by removing PATH.
void hold_before_rename(const std::string& path) {
  const char* v = std::getenv("HPCTRAIN_TEST_HOLD_BEFORE_RENAME");
  const char* colon = v ? std::strchr(v, ':') : nullptr;
  if (!colon || fs::path(path).filename().string() != std::string(v, colon)) return;
  for (int ms = 0; ms < 60000 && fs::exists(colon + 1); ++ms) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// The threads whose write sits in that pause now, its temporary file written whole
// (paused_before_rename()): a snapshot writer's pause must not pass for a checkpoint writer's.
std::mutex g_paused_mu;
std::vector<std::thread::id> g_paused;

class PausedMark {
 public:
  PausedMark() {
    std::lock_guard lock(g_paused_mu);
    g_paused.push_back(std::this_thread::get_id());
  }
  ~PausedMark() {
    std::lock_guard lock(g_paused_mu);
    g_paused.erase(std::find(g_paused.begin(), g_paused.end(), std::this_thread::get_id()));
  }
  PausedMark(const PausedMark&) = delete;
  PausedMark& operator=(const PausedMark&) = delete;
};

// The temporary files being written now, for remove_unfinished_files(): fixed buffers and
// flags, since a signal handler may read them. A slot per writer at once: rank 0 writes a
// checkpoint and a snapshot on two threads (a stop writes both), and the snapshot, done first,
// must not unmark the checkpoint still being written. 0: free, 1: being filled, 2: marked.
struct UnfinishedSlot {
  char path[4096];
  std::atomic<int> state{0};
};
UnfinishedSlot g_unfinished[4];

// The heartbeat writes under way, and whether the process ends at once (remove_unfinished_files):
// a write counts itself in before it looks at the flag, so either it sees the flag and writes
// nothing or the process's end sees it and waits for its rename.
std::atomic<int> g_heartbeats_writing{0};
std::atomic<bool> g_heartbeats_closed{false};

class HeartbeatWrite {
 public:
  HeartbeatWrite() { g_heartbeats_writing.fetch_add(1); }
  ~HeartbeatWrite() { g_heartbeats_writing.fetch_sub(1); }
  HeartbeatWrite(const HeartbeatWrite&) = delete;
  HeartbeatWrite& operator=(const HeartbeatWrite&) = delete;
  static bool closed() { return g_heartbeats_closed.load(); }
};

// The heartbeat a process that ends at once writes (write_final_heartbeat), prepared beforehand
// because it is written from where only async-signal-safe calls may be made. Two records, one of
// them published (g_final_at): a new run's is filled in the other, which no reader holds.
struct FinalHeartbeat {
  char path[4096], tmp[4096], extra[8192];
};
FinalHeartbeat g_final[2];
std::atomic<int> g_final_at{-1};  // the record published, -1: none
std::atomic<bool> g_final_armed{false};
std::atomic<int64_t> g_final_step{0}, g_final_epochs{0};

using signal_safe::append;

// Marks `tmp` as an unfinished file while it lives. A path longer than PATH_MAX, or more writers
// at once than slots, is left unmarked: to the next run's clean-up.
class UnfinishedMark {
 public:
  explicit UnfinishedMark(const std::string& tmp) {
    if (tmp.size() >= sizeof(UnfinishedSlot::path)) return;
    for (UnfinishedSlot& s : g_unfinished) {
      int free = 0;
      if (!s.state.compare_exchange_strong(free, 1)) continue;
      std::memcpy(s.path, tmp.c_str(), tmp.size() + 1);
      s.state.store(2);
      slot_ = &s;
      return;
    }
  }
  ~UnfinishedMark() {
    if (slot_) slot_->state.store(0);
  }
  UnfinishedMark(const UnfinishedMark&) = delete;
  UnfinishedMark& operator=(const UnfinishedMark&) = delete;

 private:
  UnfinishedSlot* slot_ = nullptr;
};

// The writer's mark on its temporary file, which a remove_abandoned_writes on any host can see:
// an open file description's write lock (F_OFD_SETLK), held on a duplicate of the file's descriptor
// from the file's creation to its rename (the descriptor written through is closed before the
// rename, its close checked; an OFD lock, unlike a process's lock, outlives the close of one of
// its descriptors). The kernel drops it when the writer dies, and an NFS server (EFS) when the
// writer's host stops renewing it. Where the file system takes no locks, nothing is held.
class WriterLock {
 public:
  explicit WriterLock(int fd) {  // -1: none
    if (fd >= 0 && lock_whole_file(fd) == FileLock::Taken) held_ = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  }
  ~WriterLock() {
    if (held_ >= 0) ::close(held_);
  }
  WriterLock(const WriterLock&) = delete;
  WriterLock& operator=(const WriterLock&) = delete;

 private:
  int held_ = -1;
};

// A file that replaces one at `path` takes its permission bits, as torch.save or cp over an
// existing file leaves them: a model that its owner made private (chmod 600) stays so, not
// readable by all under the umask's 644. A new file keeps the umask's.
void keep_mode_of(const std::string& path, int fd) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) ::fchmod(fd, st.st_mode & 0777);
}

}  // namespace

void write_file_atomically(const std::string& path, const std::vector<char>& bytes, const std::string& reuse,
                           bool locked, bool replace) {
  write_file_atomically(path, std::vector<ByteSpan>{{bytes.data(), bytes.size()}}, reuse, {}, locked, replace);
}

namespace {
// tmp renamed to path where no file is there: 0, else -1 with errno (EEXIST: one is).
int rename_no_replace(const std::string& tmp, const std::string& path) {
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, path.c_str(), RENAME_NOREPLACE) == 0) return 0;
  if (errno != EINVAL && errno != ENOSYS) return -1;
  // A file system without it (some network ones): a second name, which link() refuses to take
  // from a file there, then the first one's removal.
  if (::link(tmp.c_str(), path.c_str()) != 0) return -1;
  ::unlink(tmp.c_str());
  return 0;
}
}  // namespace

void write_file_atomically(const std::string& path, const std::vector<ByteSpan>& pieces, const std::string& reuse,
                           const std::function<void()>& before_rename, bool locked, bool replace,
                           WriteProgress* progress) {
  const std::string tmp = path + kTemporaryInfix + std::to_string(::getpid());
  const UnfinishedMark mark(tmp);
  const bool reused = !reuse.empty() && ::rename(reuse.c_str(), tmp.c_str()) == 0;
  // Made anew (create_new_file): its name is easy to guess, and a link or a file that another
  // user planted under it (in /tmp, beside an export's --output) was written through or renamed in.
  const int fd = reused ? ::open(tmp.c_str(), O_WRONLY | O_NOFOLLOW | O_CLOEXEC) : create_new_file(tmp);
  if (fd < 0) {
    const int err = errno;  // the open's, which the unlink could replace
    if (reused) ::unlink(tmp.c_str());
    errno = err;
    io_error("create", tmp);
  }
  const WriterLock writing(locked ? fd : -1);  // until after the rename (or the unlink of a failed write)
  keep_mode_of(path, fd);
  try {
    size_t size = 0;
    for (const ByteSpan& p : pieces) size += p.size;
    if (progress) {
      write_synced_chunks(fd, pieces, tmp, *progress);
    } else {
      for (const ByteSpan& p : pieces) write_all(fd, p.data, p.size, tmp);
    }
    if (reused && ::ftruncate(fd, static_cast<off_t>(size)) != 0) io_error("truncate", tmp);
    if (::fsync(fd) != 0) io_error("fsync", tmp);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    const int err = errno;  // the close's (EIO, EDQUOT on NFS), which the unlink could replace
    ::unlink(tmp.c_str());
    errno = err;
    io_error("close", tmp);
  }
  if (const double s = pause_before_rename(); s > 0) {
    const PausedMark paused;
    std::this_thread::sleep_for(std::chrono::duration<double>(s));
  }
  hold_before_rename(path);
  if (before_rename) {
    try {
      before_rename();
    } catch (...) {
      ::unlink(tmp.c_str());
      throw;
    }
  }
  if ((replace ? ::rename(tmp.c_str(), path.c_str()) : rename_no_replace(tmp, path)) != 0) {
    const int error = errno;
    ::unlink(tmp.c_str());
    if (!replace && error == EEXIST) usage_error(path, " appeared while it was being written, and is kept");
    const std::string both = tmp + " to " + path;
    errno = error;
    io_error("rename", both);
  }
  const std::string dir = fs::path(path).parent_path().string();
  fsync_path(dir.empty() ? "." : dir, O_RDONLY | O_DIRECTORY);
}

bool paused_before_rename(std::thread::id writer) {
  std::lock_guard lock(g_paused_mu);
  return std::find(g_paused.begin(), g_paused.end(), writer) != g_paused.end();
}

void remove_unfinished_files() {
  for (const UnfinishedSlot& s : g_unfinished)
    if (s.state.load() == 2) ::unlink(s.path);
  // A heartbeat is a few lines: one being replaced now is let finish (its rename takes its
  // temporary file away), and none starts after. A write that hangs (a stalled network file
  // system) is not waited for past a second: write_heartbeat's next call replaces what it left.
  g_heartbeats_closed.store(true);
  for (int ms = 0; ms < 1000 && g_heartbeats_writing.load() > 0; ++ms) {
    const timespec one_ms{0, 1000000};
    ::nanosleep(&one_ms, nullptr);
  }
}

namespace {
// The PID of `name` as write_file_atomically names its temporary files for `target` (target.tmp.PID), else 0.
pid_t writer_of(const std::string& name, const std::string& target) {
  const std::string prefix = target + kTemporaryInfix;
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return 0;
  pid_t pid = 0;
  const char* first = name.data() + prefix.size();
  const char* last = name.data() + name.size();
  const auto [end, ec] = std::from_chars(first, last, pid);
  return ec == std::errc() && end == last && pid > 0 ? pid : 0;
}

// Whether a writer holds its lock on the file (WriterLock), seen from any host where the file
// system passes locks on (NFSv4, EFS): nullopt where that cannot be asked.
std::optional<bool> writer_lock_held(const std::string& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  const std::optional<bool> held = whole_file_lock_held(fd);
  ::close(fd);
  return held;
}

// Why the temporary file of writer `pid` (whose status `st` is) is abandoned, or "" while its write
// may be under way. The PID names a process of the writer's host, which on shared storage (NFS,
// EFS) may be another host: there a live process of that number here is no sign of the writer, nor
// is none a sign of its death. The writer's lock is: held, a write under way on whatever host; not
// held, the writer is gone, unless its PID lives here and the file changed lately (a write of an
// hpctrain before the lock, or one in the instant between its file's creation and its lock).
// A file system that takes no locks: this host's PIDs alone, as before.
constexpr double kUnlockedWriteSeconds = 3600;  // an export's write takes seconds
std::string abandoned_because(const std::string& file, pid_t pid, const struct stat& st) {
  const std::optional<bool> locked = writer_lock_held(file);
  if (locked.value_or(false)) return "";
  // kill(pid, 0) fails with ESRCH only where no process has that PID (EPERM: another user's, alive).
  const bool pid_lives_here = ::kill(pid, 0) == 0 || errno != ESRCH;
  if (!pid_lives_here) return "was killed before it finished";
  if (!locked) return "";
  const double age = static_cast<double>(::time(nullptr) - st.st_mtime);
  if (age < kUnlockedWriteSeconds) return "";
  return "holds no lock on it, unchanged for " + std::to_string(static_cast<long long>(age / 3600)) +
         " h: its writer is gone (the PID is another process's now)";
}
}  // namespace

void remove_abandoned_writes(const std::string& path) {
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const pid_t pid = writer_of(e.path().filename().string(), target.filename().string());
    if (pid == 0 || pid == ::getpid()) continue;
    struct stat st {};
    if (::lstat(e.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) continue;
    const std::string why = abandoned_because(e.path().string(), pid, st);
    if (why.empty()) continue;
    const std::string named = (target.parent_path() / e.path().filename()).string();  // as `path` is written
    if (::unlink(e.path().c_str()) == 0)
      log::info("removed ", named, ", left by an earlier write to ", path, " whose process (", pid, ") ", why);
    else log::warn("cannot remove ", named, " (left by an earlier write killed before it finished): ",
                   std::strerror(errno));
  }
}

CheckpointStore::CheckpointStore(std::string dir, int keep, bool reuse_pages)
    : dir_(std::move(dir)), keep_(keep), reuse_pages_(reuse_pages) {
  HPC_REQUIRE(!dir_.empty(), "--checkpoint-dir must not be empty");
  HPC_REQUIRE(keep_ >= 1, "--keep-checkpoints must be at least 1, got ", keep_);
  std::error_code ec;
  make_directories(dir_, kSharedDirectoryMode, ec);  // never others' to write in, whatever the umask
  HPC_REQUIRE(!ec && fs::is_directory(dir_), "cannot create checkpoint directory ", dir_,
              ec ? ": " + ec.message() : std::string(": not a directory"));
  HPC_REQUIRE(::access(dir_.c_str(), W_OK) == 0, "checkpoint directory ", dir_, " is not writable");
  // The heartbeat and the run id are replaced by a rename, which a directory there would refuse
  // all run long (the heartbeat written through heartbeat.tmp: none at all).
  for (const auto& [name, what] : {std::pair{"heartbeat", "its heartbeat file"},
                                   std::pair{"heartbeat.tmp", "the heartbeat it is writing"},
                                   std::pair{"run-id", "its run id"}}) {
    const fs::path own = fs::path(dir_) / name;
    HPC_REQUIRE(!fs::is_directory(fs::symlink_status(own, ec)), own.string(),
                " is a directory: hpctrain replaces that path with ", what, " (move it away)");
  }
  // A writer killed before its rename leaves its temporary file (as large as a checkpoint).
  // This store is the directory's only writer now, so such leftovers are garbage.
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const std::string name = e.path().filename().string();
    // A directory named as a checkpoint would refuse that step's rename: found at the start, not
    // at the end of a run that then cannot save what it trained.
    std::error_code type;
    HPC_REQUIRE(step_of(name) < 0 || !fs::is_directory(e.symlink_status(type)), e.path().string(),
                " is a directory, not a checkpoint: a checkpoint of that step could not be written there (move it away)");
    if (name.rfind(kPrefix, 0) != 0 || name.find(std::string(kSuffix) + ".tmp.") == std::string::npos) continue;
    std::error_code rm;
    fs::remove(e.path(), rm);
    if (rm) log::warn("cannot remove the unfinished checkpoint ", e.path().string(), ": ", rm.message());
    else log::info("removed the unfinished checkpoint ", name, " (its writer was killed before finishing it)");
  }
}

std::string CheckpointStore::file_name(int64_t step) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s%09lld%s", kPrefix, static_cast<long long>(step), kSuffix);
  return buf;
}

void CheckpointStore::require_owned() const {
  if (lock_) lock_->require_held();
}

bool CheckpointStore::owned() const { return !lock_ || lock_->held(); }

void CheckpointStore::supersede_after(int64_t after) {
  require_owned();
  std::vector<std::string> newer;
  for (const std::string& path : list_checkpoints(dir_))
    if (step_of(fs::path(path).filename().string()) > after) newer.push_back(path);
  if (newer.empty()) return;
  const auto now = std::chrono::duration_cast<std::chrono::seconds>(
      std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string name = "superseded-" + std::to_string(now);
  fs::path aside = fs::path(dir_) / name;
  std::error_code ec;
  for (int n = 2; fs::exists(aside, ec); ++n) aside = fs::path(dir_) / (name + "-" + std::to_string(n));
  HPC_REQUIRE(::mkdir(aside.c_str(), kSharedDirectoryMode) == 0, "cannot create ", aside.string(), ": ", std::strerror(errno));
  for (const std::string& path : newer)
    if (::rename(path.c_str(), (aside / fs::path(path).filename()).c_str()) != 0) io_error("move", path);
  // Both directories' entries durable (POSIX promises each only for the directory synced).
  fsync_path(aside.string(), O_RDONLY | O_DIRECTORY);
  fsync_path(dir_, O_RDONLY | O_DIRECTORY);
  log::warn("moved ", newer.size(), " checkpoint(s) this run does not continue (up to ",
            fs::path(newer.front()).filename().string(), ") to ", aside.string(),
            ": left beside its own, they would outrank them, or retention would delete them");
}

std::string CheckpointStore::write(const Encoded& checkpoint, int64_t step, WriteProgress* progress) {
  require_owned();
  const std::string path = (fs::path(dir_) / file_name(step)).string();
  // The lock asked again before the rename: a run taken over during the write (its host stopped
  // for longer than the stale time) puts no file into the directory its successor now writes.
  write_file_atomically(path, checkpoint.pieces(), reuse_pages_ ? spare() : "", [this] { require_owned(); },
                        /*locked=*/false, /*replace=*/true, progress);
  // Retention: only after the new one is durable, and only by the lock's holder.
  require_owned();
  const std::vector<std::string> all = list_checkpoints(dir_);
  for (size_t i = static_cast<size_t>(keep_); i < all.size(); ++i) {
    std::error_code ec;
    if (reuse_pages_ && ::rename(all[i].c_str(), spare().c_str()) == 0) continue;
    fs::remove(all[i], ec);
    if (ec) log::warn("cannot remove old checkpoint ", all[i], ": ", ec.message());
  }
  return path;
}

std::string CheckpointStore::spare() const { return (fs::path(dir_) / kSpare).string(); }

bool overwrite_in_place(const char* path, const char* text, size_t n) {
  const int fd = ::open(path, O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  const bool whole = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && static_cast<off_t>(n) <= st.st_blocks * 512 &&
                     signal_safe::write_whole(fd, text, n) && ::ftruncate(fd, static_cast<off_t>(n)) == 0;
  return ::close(fd) == 0 && whole;
}

void write_heartbeat(const std::string& dir, int64_t step, int64_t epochs_done, const char* state,
                     const std::string& extra) {
  // Written about once a second: a failure that lasts (a full disk) is said once, not each time.
  static std::atomic<bool> warned{false};
  const std::string path = (fs::path(dir) / "heartbeat").string(), tmp = path + ".tmp";
  const HeartbeatWrite writing;
  if (HeartbeatWrite::closed()) return;  // the process ends at once: it would leave heartbeat.tmp
  const std::string text = detail::concat(
      "step=", step, "\nepoch=", epochs_done, "\nunix_time=",
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count(),
      "\npid=", ::getpid(), "\nstate=", state, "\n", extra);
  {
    ::unlink(tmp.c_str());  // a FIFO of that name would block the open; any other file is replaced anyway
    // 0644 as the checkpoints beside it, whatever the umask (under umask 000 an ofstream's 0666 let
    // every user rewrite the state and step that hpcrun and the Slurm scripts act on).
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    bool written = fd >= 0 && signal_safe::write_whole(fd, text.data(), text.size());
    int why = written ? 0 : errno;  // (what follows may set errno again)
    // A full file system may fail only here: checked before the rename, which would otherwise put
    // an empty file over the last good heartbeat.
    if (fd >= 0 && ::close(fd) != 0 && written) {
      written = false;
      why = errno;
    }
    if (!written) {
      ::unlink(tmp.c_str());
      const bool last = std::strcmp(state, "training") != 0;
      if (last && overwrite_in_place(path.c_str(), text.data(), text.size())) return;
      if (!warned.exchange(true))
        log::warn("cannot write heartbeat ", tmp, ": ", why ? std::strerror(why) : "nothing written", " (said once)");
      return;
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0 && !warned.exchange(true))
    log::warn("cannot rename heartbeat ", tmp, ": ", std::strerror(errno), " (said once)");
}

void prepare_final_heartbeat(const std::string& dir, const std::string& extra) {
  g_final_armed.store(false);
  const int at = g_final_at.load() == 0 ? 1 : 0;
  FinalHeartbeat& f = g_final[at];
  const std::string path = (fs::path(dir) / "heartbeat").string(), tmp = path + ".tmp";
  if (tmp.size() >= sizeof f.tmp || extra.size() >= sizeof f.extra) {  // none then: the run's beats go on as before
    g_final_at.store(-1);
    return;
  }
  std::memcpy(f.path, path.c_str(), path.size() + 1);
  std::memcpy(f.tmp, tmp.c_str(), tmp.size() + 1);
  std::memcpy(f.extra, extra.c_str(), extra.size() + 1);
  g_final_at.store(at);
}

void arm_final_heartbeat(int64_t step, int64_t epochs_done) {
  g_final_step.store(step);
  g_final_epochs.store(epochs_done);
  g_final_armed.store(true);
}

void disarm_final_heartbeat() { g_final_armed.store(false); }

void write_final_heartbeat(int exit_code) {
  const int at = g_final_at.load();
  // A heartbeat write that still hangs (remove_unfinished_files waited a second for it): the
  // storage does not answer, and its temporary file is that write's.
  if (!g_final_armed.load() || at < 0 || g_heartbeats_writing.load() > 0) return;
  // Another run took the directory over (this one was stopped or cut off for the stale time):
  // the heartbeat is that run's now, as its beats are (Heartbeat::beat asks owned() too).
  if (lock_lost_at_exit()) return;
  const FinalHeartbeat& f = g_final[at];
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  char text[sizeof f.extra + 256];
  size_t n = 0;
  append(text, sizeof text, &n, "step=");
  append(text, sizeof text, &n, g_final_step.load());
  append(text, sizeof text, &n, "\nepoch=");
  append(text, sizeof text, &n, g_final_epochs.load());
  append(text, sizeof text, &n, "\nunix_time=");
  append(text, sizeof text, &n, static_cast<int64_t>(now.tv_sec));
  append(text, sizeof text, &n, "\npid=");
  append(text, sizeof text, &n, static_cast<int64_t>(::getpid()));
  append(text, sizeof text, &n, "\nstate=stopped\n");
  append(text, sizeof text, &n, f.extra);
  append(text, sizeof text, &n, "exit_code=");
  append(text, sizeof text, &n, static_cast<int64_t>(exit_code));
  append(text, sizeof text, &n, "\n");
  ::unlink(f.tmp);  // as write_heartbeat: a FIFO of that name would block the open
  // Made anew: never through a link put under the name since (by the directory's owner, another
  // user's directory that root trusts); one there now leaves the heartbeat overwritten in place.
  const int fd = ::open(f.tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    overwrite_in_place(f.path, text, n);
    return;
  }
  const bool whole = signal_safe::write_whole(fd, text, n);
  // Never an empty or cut file over the last good heartbeat (a full file system): the old one is
  // overwritten in place then, as write_heartbeat's last beat.
  if (::close(fd) == 0 && whole && ::rename(f.tmp, f.path) == 0) return;
  ::unlink(f.tmp);
  overwrite_in_place(f.path, text, n);
}

std::map<std::string, std::string> read_heartbeat(const std::string& dir) {
  return read_key_values((fs::path(dir) / "heartbeat").string());
}

int64_t heartbeat_step(const std::map<std::string, std::string>& beat) {
  const auto it = beat.find("step");
  if (it == beat.end()) return -1;
  const std::string& text = it->second;
  int64_t step = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), step);
  return ec == std::errc() && end == text.data() + text.size() && step >= 0 ? step : -1;
}

std::string heartbeat_owner_lines(const std::string& token, const std::string& attempt) {
  return token.empty() || attempt.empty() ? "" : "hpcrun_token=" + token + "\nhpcrun_attempt=" + attempt + "\n";
}

bool heartbeat_is_of(const std::map<std::string, std::string>& beat, const std::string& token,
                     const std::string& attempt) {
  return beat.find("hpcrun_token") == beat.end() || names_hpcrun_attempt(beat, token, attempt);
}

bool names_hpcrun_attempt(const std::map<std::string, std::string>& record, const std::string& token,
                          const std::string& attempt) {
  const auto named_token = record.find("hpcrun_token"), named_attempt = record.find("hpcrun_attempt");
  return named_token != record.end() && named_token->second == token && named_attempt != record.end() &&
         named_attempt->second == attempt;
}

namespace {
std::string hpcrun_env(const char* name, const char* allowed) {
  const char* v = std::getenv(name);
  if (!v || !*v || std::string(v).find_first_not_of(allowed) != std::string::npos) return "";
  return v;
}
}  // namespace

std::string hpcrun_token_from_env() { return hpcrun_env("HPCRUN_TOKEN", "0123456789abcdef"); }
std::string hpcrun_attempt_from_env() { return hpcrun_env("HPCRUN_ATTEMPT", "0123456789"); }

std::map<std::string, std::string> hpcrun_owner_fields(const std::string& token, const std::string& attempt) {
  if (token.empty() || attempt.empty()) return {};
  return {{"hpcrun_token", token}, {"hpcrun_attempt", attempt}};
}

MembershipMarker membership_marker(const std::string& dir, const std::string& token) {
  const fs::path marker = fs::path(dir) / kMembershipMarkerFile;
  std::error_code ec;
  if (!fs::exists(marker, ec)) return MembershipMarker::None;
  const std::map<std::string, std::string> fields = read_key_values(marker.string());
  const auto it = fields.find("token");
  return !token.empty() && it != fields.end() && it->second == token ? MembershipMarker::Ours
                                                                      : MembershipMarker::Stale;
}

void write_membership_marker(const std::string& dir, const std::string& token) {
  const std::string path = (fs::path(dir) / kMembershipMarkerFile).string();
  const std::string text = detail::concat("token=", token, "\npid=", ::getpid(), "\n");
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);  // as the heartbeat
  if (fd < 0) return;  // as before: no marker, and the stop writes a checkpoint instead of snapshots
  signal_safe::write_whole(fd, text.data(), text.size());
  ::close(fd);
}

void remove_membership_marker(const std::string& dir, const std::string& token) {
  std::error_code ec;
  if (membership_marker(dir, token) == MembershipMarker::Ours) fs::remove(fs::path(dir) / kMembershipMarkerFile, ec);
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  // A directory that cannot be read must not look empty: --resume auto would start afresh.
  HPC_REQUIRE(!ec || ec == std::errc::no_such_file_or_directory, "cannot list checkpoint directory ", dir, ": ",
              ec.message());
  for (const auto& e : it) {
    const int64_t step = step_of(e.path().filename().string());
    if (step >= 0 && e.is_regular_file(ec)) found.emplace_back(step, e.path().string());
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

namespace {

// The system's refusal to read a checkpoint (errno): UnreadableCheckpoint, but for a file gone
// since it was listed (or a link to nothing), which is no checkpoint any more.
[[noreturn]] void refused_reading(const std::string& path) {
  const int err = errno;
  if (err == ENOENT) io_error("read checkpoint", path);
  throw UnreadableCheckpoint(detail::concat("cannot read checkpoint ", path, ": ", std::strerror(err)));
}

}  // namespace

Checkpoint load_checkpoint(const std::string& path, Layout* layout, Arenas arenas) {
  // O_NONBLOCK: a FIFO given by mistake is refused below instead of waiting for a writer.
  const FileCloser file{::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)};
  if (file.fd < 0) refused_reading(path);
  struct stat st {};
  if (::fstat(file.fd, &st) != 0) refused_reading(path);
  HPC_REQUIRE(S_ISREG(st.st_mode), "cannot read checkpoint ", path, ": ",
              S_ISDIR(st.st_mode) ? "it is a directory (give a checkpoint file in it)" : "not a regular file");
  // Read as decode goes, each section straight into its place: a large file given by mistake (a
  // dataset, an archive) is refused at its magic, and a checkpoint needs no copy of the whole file.
  auto read = [&](char* dst, size_t n) {
    while (n > 0) {
      const ssize_t got = ::read(file.fd, dst, n);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) refused_reading(path);
      HPC_REQUIRE(got > 0, "checkpoint ", path, " is truncated (it became shorter than its ", st.st_size,
                  " bytes while it was read)");
      dst += got;
      n -= static_cast<size_t>(got);
    }
  };
  Checkpoint c = decode(static_cast<uint64_t>(st.st_size), read, "checkpoint " + path, layout, arenas);
  require_step_of_name(c, path);
  return c;
}

LatestCheckpoint find_latest(const std::string& dir, Arenas arenas) {
  LatestCheckpoint latest;
  const std::vector<std::string> files = list_checkpoints(dir);
  latest.listed = files.size();
  std::optional<CheckpointTooLarge> too_large;  // the smallest newer file that did not fit
  const auto memory_is_short = [&](const std::string& why) {
    return UnreadableCheckpoint(detail::concat(too_large->what(), "; not passed by: ", why,
                                               ", so this process's memory is short, not the file wrong (give the run "
                                               "more memory: --mem, ulimit -v)"));
  };
  for (const std::string& path : files) {
    std::optional<Checkpoint> c;
    try {
      c = load_checkpoint(path, nullptr, arenas);
    } catch (const UnreadableCheckpoint& e) {
      throw UnreadableCheckpoint(detail::concat(e.what(), "; an unreadable checkpoint is not passed by for an older "
                                                "one: make it readable, or move it out of ", dir));
    } catch (const NewerFormatCheckpoint& e) {
      throw NewerFormatCheckpoint(detail::concat(e.what(), "; it is not passed by for an older one: run the hpctrain "
                                                 "that wrote it, or move it out of ", dir));
    } catch (const CheckpointTooLarge& e) {
      if (!too_large || e.bytes < too_large->bytes) too_large.emplace(e);
      latest.skipped.push_back(e.what());
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::Usage) throw;
      latest.skipped.push_back(e.what());
    }
    if (!c) continue;
    std::error_code ec;
    const uint64_t bytes = std::filesystem::file_size(path, ec);
    if (too_large && !ec && bytes >= too_large->bytes)
      throw memory_is_short(detail::concat("the older ", path, " is as large (", bytes, " bytes) and fits"));
    latest.found = std::make_pair(path, std::move(*c));
    return latest;
  }
  if (too_large) throw memory_is_short("no older checkpoint fits either");
  return latest;
}

int64_t newest_valid_step(const std::string& dir) {
  const LatestCheckpoint latest = find_latest(dir, Arenas::Check);
  return latest.found ? latest.found->second.integer("step") : -1;
}

std::optional<std::pair<std::string, Checkpoint>> load_latest(const std::string& dir) {
  LatestCheckpoint latest = find_latest(dir);
  for (size_t i = 0; i < latest.skipped.size(); ++i) {
    const bool last = i + 1 == latest.skipped.size();
    if (!last) log::warn(latest.skipped[i]);
    else if (latest.found) log::warn(latest.skipped[i], "; using the previous valid one, ", latest.found->first);
    else log::warn(latest.skipped[i], "; no valid checkpoint is left in ", dir, ": starting afresh");
  }
  return std::move(latest.found);
}

AsyncWriter::AsyncWriter(CheckpointStore& store) : store_(store), thread_([this] { run(); }) {}

AsyncWriter::~AsyncWriter() {
  {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return !pending_ && !busy_; });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

double AsyncWriter::submit(Checkpoint snapshot, int64_t step, std::function<void()> fill) {
  const auto t0 = std::chrono::steady_clock::now();
  {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return (!pending_ && !busy_) || failure_; });
    if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
    pending_.emplace(Job{std::move(snapshot), step, std::move(fill)});
  }
  cv_.notify_all();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void AsyncWriter::wait() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return (!pending_ && !busy_) || failure_; });
  if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
}

bool AsyncWriter::wait_for(double seconds) {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, std::chrono::duration<double>(std::max(0.0, seconds)),
                      [&] { return (!pending_ && !busy_) || failure_; });
}

Checkpoint AsyncWriter::recycled() {
  wait();
  std::lock_guard lock(mu_);
  return std::move(spare_);
}

bool AsyncWriter::paused_before_rename() const { return ckpt::paused_before_rename(thread_.get_id()); }

bool AsyncWriter::idle() {
  std::lock_guard lock(mu_);
  return !pending_ && !busy_;
}

std::string AsyncWriter::last_written() {
  std::lock_guard lock(mu_);
  return last_;
}

std::pair<int64_t, double> AsyncWriter::completed() {
  std::lock_guard lock(mu_);
  return {completed_, completed_unix_};
}

void AsyncWriter::run() {
  ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10);
  for (;;) {
    Job job;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || pending_; });
      if (!pending_) return;
      job = std::move(*pending_);
      pending_.reset();
      busy_ = true;
      progress_.synced.store(0);
      progress_.total.store(0);
    }
    std::string path;
    std::exception_ptr failure;
    try {
      if (job.fill) job.fill();
      const Encoded encoded(job.snapshot);  // (the CRCs) here, off the step loop
      path = store_.write(encoded, job.step, &progress_);
    } catch (...) {
      failure = std::current_exception();
    }
    {
      std::lock_guard lock(mu_);
      busy_ = false;
      spare_ = std::move(job.snapshot);
      if (failure) {
        failure_ = std::move(failure);  // the caller's alone: this thread keeps no reference to release after it
      } else {
        last_ = path;
        ++completed_;
        completed_unix_ = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
      }
    }
    cv_.notify_all();
  }
}

std::vector<NamedPath> checkpoint_inputs(const std::string& option, const std::string& path) {
  std::vector<NamedPath> inputs{{option, path}};
  std::error_code ec;
  if (!path.empty() && std::filesystem::is_directory(path, ec))
    for (const std::string& file : ckpt::list_checkpoints(path))
      inputs.push_back({option + " " + path + "'s checkpoint", file});
  return inputs;
}

bool is_store_file(const std::string& name) {
  if (name == kSpare) return true;
  return name.rfind(kPrefix, 0) == 0 && name.find(kSuffix) != std::string::npos;  // and PATH.tmp.PID
}

bool checkpoint_dir_uses(const std::string& name) {
  if (is_store_file(name)) return true;
  for (const char* own : {"lock", "run-id", "heartbeat", "heartbeat.tmp", kMembershipMarkerFile, "hpcrun"})
    if (name == own) return true;
  return name.rfind("superseded-", 0) == 0;
}

}  // namespace hpc::ckpt

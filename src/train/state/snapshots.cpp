#include "train/state/snapshots.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <boost/program_options.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <utility>

#include "ckpt/dir_lock.hpp"
#include "core/cpus.hpp"
#include "core/duration.hpp"
#include "core/error.hpp"
#include "core/exit_codes.hpp"
#include "core/file_identity.hpp"  // require_not_root_dir
#include "core/hash.hpp"
#include "core/log.hpp"
#include "core/option_kit.hpp"
#include "dist/agree.hpp"
#include "train/options/subcommand.hpp"

namespace hpc::train {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

constexpr const char* kRunIdFile = "run-id";
constexpr size_t kRunIdLength = 16;  // hex digits
// In every run directory: locked (shared) by the run's snapshot writer while it lives; a
// cleanup that cannot lock it exclusively leaves the directory alone.
constexpr const char* kInUseFile = "in-use";
// In every run directory: the run's checkpoint directory (absolute) and, on a line
// "directory_inode=N", its inode, for a cleanup on a host the run has left to see that the run
// has ended for good (ended_run).
constexpr const char* kOwnerFile = "checkpoint-dir";

bool is_run_id(const std::string& s) {
  return s.size() == kRunIdLength && std::all_of(s.begin(), s.end(), [](char c) { return std::isxdigit(c); });
}

std::string new_run_id() {
  std::random_device device;
  const uint64_t v = (static_cast<uint64_t>(device()) << 32) ^ device() ^
                     static_cast<uint64_t>(Clock::now().time_since_epoch().count()) ^ (uint64_t(::getpid()) << 16);
  return hex64(v);
}

// CHECKPOINT_DIR/run-id: the id, then "directory_inode=N", the inode of the directory it was
// written in. A copy of the directory (cp -r, to branch an experiment) has another inode: its
// run-id is not its own, or both jobs would share one snapshot directory, each resuming and
// removing the other's. The inode, not the device or the path: an NFS or EFS directory has the
// same inode on every host (its device number and mount point may differ), and a move keeps it.
std::string directory_inode(const std::string& dir) {
  struct stat st {};
  return ::stat(dir.c_str(), &st) == 0 ? std::to_string(st.st_ino) : "";
}

// A record naming a directory (run-id, a run directory's checkpoint-dir): its first line, then
// "directory_inode=N" with `dir`'s inode.
std::string directory_record(const std::string& first, const std::string& dir) {
  return first + "\ndirectory_inode=" + directory_inode(dir) + "\n";
}
// The inode in the rest of a record read past its first line ("" when it has none).
std::string recorded_inode(std::istream& in) {
  for (std::string line; std::getline(in, line);)
    if (line.rfind("directory_inode=", 0) == 0) return line.substr(16);
  return "";
}

struct RunIdFile {
  std::string id;     // "" when there is none (or it is not an id)
  std::string inode;  // "" when the file does not say (written before the line was)
};

RunIdFile read_run_id(const std::string& dir) {
  std::istringstream in(ckpt::read_small_file((fs::path(dir) / kRunIdFile).string()));
  RunIdFile f;
  if (!(in >> f.id) || !is_run_id(f.id)) return {};
  f.inode = recorded_inode(in);
  return f;
}

std::string format_bytes(double bytes) {
  char buf[32];
  const char* unit[] = {"B", "kB", "MB", "GB", "TB"};
  int u = 0;
  while (bytes >= 1000 && u < 4) bytes /= 1000, ++u;
  std::snprintf(buf, sizeof buf, u ? "%.1f %s" : "%.0f %s", bytes, unit[u]);
  return buf;
}

// The bytes of the regular files in `dir` (0 when it cannot be read).
uint64_t bytes_in(const fs::path& dir) {
  uint64_t bytes = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file(ec)) bytes += e.file_size(ec);
  return bytes;
}

// Free bytes of the file system holding `dir`, plus what the run's own snapshots there take
// (they are replaced, not added to).
uint64_t room_for_snapshots(const std::string& dir) {
  struct statvfs s {};
  if (::statvfs(dir.c_str(), &s) != 0) return 0;
  return static_cast<uint64_t>(s.f_bavail) * s.f_frsize + bytes_in(dir);
}

// That `dir` is a directory of this user's (not a link) that others cannot write in: in a shared
// /dev/shm another user could have made it, or a run directory in it (under root's --snapshot-dir
// /dev/shm), and would then read or replace the state, or plant a snapshot for --resume auto to
// take. The parent of the run directories may be writable by others if sticky (others can then
// move no run directory of this user's out, nor one of theirs in: its owner is checked); a run
// directory may not, as others could put files in it. Usage error naming it otherwise.
void require_private(const fs::path& dir, bool sticky_will_do) {
  struct stat st {};
  HPC_REQUIRE(::lstat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), dir.string(), " is not a directory",
              S_ISLNK(st.st_mode) ? " (a link)" : "");
  HPC_REQUIRE(st.st_uid == ::geteuid(), dir.string(), " belongs to another user (uid ", st.st_uid, ")");
  const bool open = (st.st_mode & (S_IWGRP | S_IWOTH)) && !(sticky_will_do && (st.st_mode & S_ISVTX));
  HPC_REQUIRE(!open, sticky_will_do ? "--snapshot-dir " : "", dir.string(), " is writable by others",
              sticky_will_do ? " and not sticky" : "", " (mode ", mode_text(st.st_mode),
              "): they could move or replace the kept state; chmod go-w it, or give a directory of its own");
}

// The parent of the run directories (run_dir false), made private when made here: one that was
// there is left as it is (--snapshot-dir /dev/shm as root must not lock the machine's other users
// out). A run directory (run_dir true) is made private whatever its parent's mode. Then
// require_private.
void require_own_directory(const fs::path& dir, bool run_dir) {
  std::error_code ec;
  const bool existed = fs::exists(fs::symlink_status(dir, ec));
  make_directories(dir.string(), 0700, ec);  // private from its first moment, not after a chmod
  struct stat st {};
  HPC_REQUIRE(::lstat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), "cannot create ", dir.string(),
              ec ? ": " + ec.message() : std::string(": not a directory"));
  HPC_REQUIRE(st.st_uid == ::geteuid(), dir.string(), " belongs to another user (uid ", st.st_uid, ")");
  if (!existed || run_dir) ::chmod(dir.c_str(), 0700);
  require_private(dir, !run_dir);
}

// The other runs' directories in `parent` (named by a run id), oldest first.
struct RunDir {
  fs::path path;
  std::string id;
  double age_seconds = 0;  // since its last write
  uint64_t bytes = 0;      // its files'
};
// Whether `dir` holds nothing but what a Snapshotter writes (its in-use file, the store's
// checkpoints and their temporary files, its spare), or nothing at all: a directory whose name
// merely looks like a run id (16 hex digits) is not removed when it holds anything else, nor a
// checkpoint directory of that name (its lock, run-id and heartbeat).
bool holds_only_snapshots(const fs::path& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::error_code ec2;
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file(ec2) || e.is_symlink(ec2)) return false;
    const bool owner = name == kOwnerFile || name.rfind(std::string(kOwnerFile) + ".tmp.", 0) == 0;
    if (name != kInUseFile && !owner && !ckpt::is_store_file(name)) return false;
  }
  return !ec;
}

std::vector<RunDir> run_dirs(const fs::path& parent, const std::string& except) {
  std::vector<RunDir> runs;
  std::error_code ec;
  const auto now = fs::file_time_type::clock::now();
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    std::error_code ec2;
    const std::string name = e.path().filename().string();
    if (!is_run_id(name) || name == except || !e.is_directory(ec2) || e.is_symlink(ec2)) continue;
    if (!holds_only_snapshots(e.path())) {
      log::info("kept ", e.path().string(), ": it holds files that are not hpctrain's snapshots");
      continue;
    }
    const auto written = fs::last_write_time(e.path(), ec2);
    if (ec2) continue;
    runs.push_back({e.path(), name, std::chrono::duration<double>(now - written).count(), bytes_in(e.path())});
  }
  std::sort(runs.begin(), runs.end(), [](const RunDir& a, const RunDir& b) { return a.age_seconds > b.age_seconds; });
  return runs;
}

// Removes `run` unless a running hpctrain holds it (its in-use file locked); the lock is held
// across the removal, so no run can take the directory up meanwhile. Whether it went.
bool remove_unless_in_use(const RunDir& run, const char* why, CleanedSnapshots& c) {
  const uint64_t bytes = run.bytes;
  const int fd = ::open((run.path / kInUseFile).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd >= 0 && ::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    ++c.kept_in_use, c.kept_bytes += bytes;
    log::info("kept the snapshots of run ", run.id, ": a running hpctrain uses them (", run.path.string(), ")");
    return false;
  }
  std::error_code ec;
  fs::remove_all(run.path, ec);
  if (fd >= 0) ::close(fd);
  if (ec) {
    log::warn("cannot remove the snapshots ", run.path.string(), ": ", ec.message());
    ++c.kept_young, c.kept_bytes += bytes;
    return false;
  }
  ++c.removed, c.freed_bytes += bytes;
  log::info("removed the snapshots of run ", run.id, " (", why, ", ", format_bytes(static_cast<double>(bytes)),
            ", last written ", show_duration(run.age_seconds), " ago): ", run.path.string());
  return true;
}

// This host's newest valid snapshot of run `run_id` above the newest checkpoint's step that
// `fits` (when given: it throws the reason a run cannot resume it); every other one on the way is
// named in a warning. With no checkpoint to fall back to (checkpoint_step -1), one that `fits`
// refuses is refused as a checkpoint would be (a usage error): the fresh start would replace the
// run's only saved state.
using Found = std::optional<std::pair<std::string, ckpt::Checkpoint>>;
Found newest_snapshot(const std::string& run_dir, const std::string& run_id, int64_t checkpoint_step,
                      const std::function<void(const ckpt::Checkpoint&)>& fits) {
  std::vector<std::string> files;
  // A --snapshot-dir that is no directory holds no snapshot: the Snapshotter says it cannot use
  // it (a warning of its own), not a "checkpoint directory" that cannot be listed here.
  std::error_code ec;
  if (!fs::is_directory(fs::path(run_dir).parent_path(), ec)) return std::nullopt;
  try {
    // Before anything in them is read: a snapshot planted by another user is no state of this run.
    require_private(fs::path(run_dir).parent_path(), true);
    if (fs::exists(fs::symlink_status(run_dir, ec))) require_private(run_dir, false);
    files = ckpt::list_checkpoints(run_dir);
  } catch (const Error& e) {
    log::warn("snapshots not read: ", e.what());
    return std::nullopt;
  }
  for (const std::string& file : files) {
    std::string misfit;  // why this run's options do not fit the snapshot
    try {
      ckpt::Checkpoint c = ckpt::load_checkpoint(file);
      const auto id = c.meta.find("run_id");
      HPC_REQUIRE(id != c.meta.end() && id->second == run_id, "it is of another run (run id ",
                  id == c.meta.end() ? std::string("none") : id->second, ", this run's ", run_id, ")");
      const int64_t step = c.integer("step");
      if (step == checkpoint_step) return std::nullopt;  // the checkpoint holds the same state
      HPC_REQUIRE(step > checkpoint_step, "it is older (step ", step, ") than the newest checkpoint (step ",
                  checkpoint_step, ")");
      try {
        if (fits) fits(c);
      } catch (const Error& e) {
        misfit = e.what();
        throw;
      }
      HPC_REQUIRE(!first_non_finite(c), "it holds a state that is not finite");
      return std::make_pair(file, std::move(c));
    } catch (const Error& e) {
      if (!misfit.empty() && checkpoint_step < 0)
        usage_error("the snapshot ", file, ", this run's only saved state (in host memory, no checkpoint yet), does "
                    "not fit this run: ", misfit);
      log::warn("snapshot ", file, " ignored: ", e.what());
    }
  }
  return std::nullopt;
}

// The lowest rank holding the newest of the hosts' snapshots (`mine`: this rank's, on each host's
// first rank), or -1 where none holds one. Collective.
int newest_holder(dist::Communicator& comm, const Found& mine) {
  const uint64_t my_step = mine ? static_cast<uint64_t>(mine->second.integer("step") + 1) : 0;
  const std::vector<uint64_t> steps = comm.size() > 1 ? comm.allgather(my_step) : std::vector<uint64_t>{my_step};
  const auto newest = std::max_element(steps.begin(), steps.end());
  return *newest > 0 ? static_cast<int>(newest - steps.begin()) : -1;
}

}  // namespace

RunIdentity run_identity(dist::ProcessContext& ctx, const TrainOptions& o) {
  RunIdentity r;
  if (o.checkpoint_dir.empty()) return r;
  if (ctx.rank() == 0) {
    const RunIdFile file = read_run_id(o.checkpoint_dir);
    const std::string here = directory_inode(o.checkpoint_dir);
    if (!file.inode.empty() && file.inode != here)
      log::warn(o.checkpoint_dir, "/run-id was written in another directory (this is a copy of it?): this run "
                "takes a new run id, and the other directory's snapshots are not its own");
    else
      r.previous = file.id;
    r.id = o.resume == ResumeFrom::Auto && !r.previous.empty() ? r.previous : new_run_id();
    r.unbound = file.inode.empty();
  }
  r.id = dist::broadcast_string(ctx.world(), r.id, 0);
  r.previous = dist::broadcast_string(ctx.world(), r.previous, 0);
  return r;
}

void record_run_identity(const TrainOptions& o, const RunIdentity& r) {
  if (o.checkpoint_dir.empty()) return;
  const fs::path path = fs::path(o.checkpoint_dir) / kRunIdFile;
  if (o.snapshot_every_steps == 0) {
    // No snapshots, but a new lineage all the same: the old id must not make a later run with
    // snapshots take the old run's for its own.
    std::error_code ec;
    if (r.id != r.previous) fs::remove(path, ec);
    return;
  }
  if (r.id == r.previous && !r.unbound) return;  // the directory's, and it says so
  const std::string text = directory_record(r.id, o.checkpoint_dir);
  ckpt::write_file_atomically(path.string(), std::vector<char>(text.begin(), text.end()));
}

std::string default_snapshot_parent() { return "/dev/shm/hpctrain-" + std::to_string(::geteuid()); }

std::string snapshot_run_dir(const TrainOptions& o, const std::string& run_id) {
  if (o.snapshot_every_steps == 0 || o.checkpoint_dir.empty() || run_id.empty()) return "";
  const std::string parent = o.snapshot_dir.empty() ? default_snapshot_parent() : o.snapshot_dir;
  return (fs::path(parent) / run_id).string();
}

// Why nothing will resume `run`'s snapshots any more, as its checkpoint directory (kOwnerFile)
// tells: its heartbeat says "done" under the run's id (a run that is extended later resumes
// from its final checkpoint, which is newer), or its run-id names another run (a fresh start
// there). nullptr when it cannot tell: no record (an older hpctrain's), the directory gone,
// moved, replaced (another inode) or unreadable, or the run not finished.
const char* ended_run(const RunDir& run) {
  std::istringstream in(ckpt::read_small_file((run.path / kOwnerFile).string()));
  std::string dir;
  if (!std::getline(in, dir) || dir.empty()) return nullptr;
  const std::string inode = recorded_inode(in);
  if (inode.empty() || directory_inode(dir) != inode) return nullptr;
  const RunIdFile owner = read_run_id(dir);
  if (owner.id.empty() || (!owner.inode.empty() && owner.inode != inode)) return nullptr;
  if (owner.id != run.id) return "its checkpoint directory went on to another run";
  const std::map<std::string, std::string> beat = ckpt::read_heartbeat(dir);
  const auto state = beat.find("state");
  return state != beat.end() && state->second == "done" ? "its run has finished" : nullptr;
}

CleanedSnapshots clean_snapshots(const std::string& parent, const SnapshotCleaning& what) {
  CleanedSnapshots c;
  for (const RunDir& run : run_dirs(parent, what.except)) {
    if (!what.run_id.empty() && run.id != what.run_id) continue;
    const char* why = what.all                  ? "every run's not in use"
                      : !what.run_id.empty()    ? "the run asked for"
                      : run.age_seconds > what.older_than ? "older than the limit"
                      : what.ended_runs                   ? ended_run(run)
                                                          : nullptr;
    if (!why) {
      ++c.kept_young, c.kept_bytes += run.bytes;
      continue;
    }
    remove_unless_in_use(run, why, c);
  }
  return c;
}

const char* source_name(StateSource s) {
  switch (s) {
    case StateSource::None: return "none";
    case StateSource::Checkpoint: return "checkpoint";
    case StateSource::Snapshot: return "snapshot";
  }
  return "?";
}

FoundState find_resume_state(dist::ProcessContext& ctx, const TrainOptions& o, const nn::Model<float>& model,
                             int64_t training_samples, const std::string& run_dir, const std::string& run_id) {
  FoundState f;
  if (run_dir.empty() || o.resume != ResumeFrom::Auto) {
    f.state = find_resume(o, ctx, &f.path);
    f.source = f.state ? StateSource::Checkpoint : StateSource::None;
    return f;
  }
  std::optional<std::pair<std::string, ckpt::Checkpoint>> shared, mine;
  dist::collectively(ctx, [&] {
    if (ctx.rank() == 0) shared = ckpt::load_latest(o.checkpoint_dir);
  });
  dist::Communicator& comm = ctx.world();
  int64_t shared_step = shared ? shared->second.integer("step") : -1;
  if (comm.size() > 1) comm.broadcast(&shared_step, sizeof shared_step, 0);
  dist::collectively(ctx, [&] {
    if (ctx.local_rank() == 0)
      mine = newest_snapshot(run_dir, run_id, shared_step,
                             [&](const ckpt::Checkpoint& c) { check_resumable(c, o, model, training_samples); });
  });
  // The newest snapshot of any host, from the lowest rank that holds it; else the checkpoint.
  const int holder = newest_holder(comm, mine);
  const bool snapshot = holder >= 0;
  const int root = snapshot ? holder : 0;
  std::optional<ckpt::Checkpoint> state;
  if (snapshot && ctx.rank() == root) f.path = mine->first, state = std::move(mine->second);
  if (!snapshot && ctx.rank() == 0 && shared) f.path = shared->first, state = std::move(shared->second);
  f.state = share_checkpoint(comm, std::move(state), root, &f.path);
  f.source = snapshot ? StateSource::Snapshot : f.state ? StateSource::Checkpoint : StateSource::None;
  if (snapshot && ctx.rank() == 0)
    log::info("the newest state is a snapshot in host memory (", f.path, ", on rank ", root,
              "'s host), newer than the newest checkpoint",
              shared_step >= 0 ? detail::concat(" (step ", shared_step, ")") : std::string(" (none)"));
  return f;
}

Snapshotter::Snapshotter(dist::ProcessContext& ctx, const TrainOptions& o, Engine& engine, ModelIdentity model,
                         std::string run_dir, std::string run_id, const std::string& previous_run_id)
    : ctx_(ctx), o_(o), engine_(engine), model_(std::move(model)), run_dir_(std::move(run_dir)),
      run_id_(std::move(run_id)), every_(o.snapshot_every_steps > 0 ? o.snapshot_every_steps : 1) {
  if (run_dir_.empty()) return;
  ckpt::Checkpoint probe;  // the sizes of the state
  engine_.snapshot(probe);
  const size_t state_bytes = ckpt::encoded_size(probe);
  bool ok = true;
  if (ctx_.local_rank() == 0) {
    try {
      require_own_directory(fs::path(run_dir_).parent_path(), false);
      remove_leftovers(previous_run_id);
      hold_in_use();
      record_checkpoint_dir();
      store_ = std::make_unique<ckpt::CheckpointStore>(run_dir_, 1, /*reuse_pages=*/true);
      check_budget(state_bytes);
    } catch (const Error& e) {
      log::warn("snapshots in host memory off on ", ctx_.host(), ": ", e.what(),
                "; training goes on with the checkpoints on shared storage alone");
      store_.reset();
      ok = false;
    }
  }
  // Every host keeps snapshots or none does (one warning says which host cannot).
  double failed = ok ? 0 : 1;
  if (ctx_.world_size() > 1) ctx_.world().allreduce_sum(&failed, 1);
  enabled_ = failed == 0;
  if (!enabled_) {
    if (ctx_.rank() == 0 && ok) log::warn("snapshots in host memory off: another host cannot keep them");
    store_.reset();
    return;
  }
  if (store_) writer_ = std::make_unique<ckpt::AsyncWriter>(*store_);
  if (ctx_.rank() == 0)
    log::info("snapshots of the training state in host memory: ", run_dir_, ", ",
              o_.snapshot_every_steps > 0 ? detail::concat("every ", o_.snapshot_every_steps, " step(s)")
                                          : std::string("as often as costs under 1% of the step time"),
              " (", format_bytes(static_cast<double>(state_bytes)), " each)");
}

Snapshotter::~Snapshotter() {
  if (in_use_fd_ >= 0) ::close(in_use_fd_);
}

void Snapshotter::check_budget(size_t state_bytes) {
  // A snapshot being written beside the last one: twice the state.
  const uint64_t need = 2 * static_cast<uint64_t>(state_bytes);
  const uint64_t budget = cpus::memory_size(o_.snapshot_max_memory, cpus::host_memory_bytes(), "--snapshot-max-memory");
  HPC_REQUIRE(need <= budget, "they need ", format_bytes(static_cast<double>(need)), " (twice the state of ",
              format_bytes(static_cast<double>(state_bytes)), ") and --snapshot-max-memory allows ",
              format_bytes(static_cast<double>(budget)), " (", o_.snapshot_max_memory, ")");
  // The budget is the user's on this host, across all runs: the other runs' snapshots that no
  // running hpctrain uses go first, oldest first, to make room; those in use are never taken.
  const fs::path parent = fs::path(run_dir_).parent_path();
  std::vector<RunDir> others = run_dirs(parent, run_id_);
  uint64_t held = 0;
  for (const RunDir& r : others) held += r.bytes;
  CleanedSnapshots c;
  for (const RunDir& r : others) {
    if (need + held <= budget) break;
    if (remove_unless_in_use(r, "room for this run's under --snapshot-max-memory", c)) held -= r.bytes;
  }
  HPC_REQUIRE(need + held <= budget, "they need ", format_bytes(static_cast<double>(need)), " and the snapshots of ",
              c.kept_in_use, " other running job(s) of this user in ", parent.string(), " hold ",
              format_bytes(static_cast<double>(held)), " of the ", format_bytes(static_cast<double>(budget)),
              " --snapshot-max-memory allows (", o_.snapshot_max_memory, ") across all of them");
  const uint64_t room = room_for_snapshots(run_dir_);
  HPC_REQUIRE(need <= room, "they need ", format_bytes(static_cast<double>(need)), " and ", run_dir_, " has ",
              format_bytes(static_cast<double>(room)), " free");
}

void Snapshotter::remove_leftovers(const std::string& previous_run_id) {
  const std::string parent = fs::path(run_dir_).parent_path().string();
  if (!previous_run_id.empty() && previous_run_id != run_id_)  // the lineage a fresh start in this directory ended
    clean_snapshots(parent, {.older_than = 0, .all = false, .run_id = previous_run_id, .except = run_id_});
  clean_snapshots(parent, {.older_than = kSnapshotKeepSeconds, .all = false, .run_id = "", .except = run_id_});
}

void Snapshotter::hold_in_use() {
  // A cleanup holds the lock exclusively while it removes a directory: taken after it, the lock
  // may be on a file it removed; then the directory is made again and the lock taken anew.
  const fs::path file = fs::path(run_dir_) / kInUseFile;
  for (int attempt = 0; attempt < 3; ++attempt) {
    require_own_directory(run_dir_, true);  // the state is this user's alone, whatever its parent's mode
    const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    HPC_REQUIRE(fd >= 0, "cannot create ", file.string(), ": ", std::strerror(errno));
    struct stat held {}, now {};
    if (::flock(fd, LOCK_SH) == 0 && ::fstat(fd, &held) == 0 && ::stat(file.c_str(), &now) == 0 &&
        held.st_ino == now.st_ino && held.st_dev == now.st_dev) {
      in_use_fd_ = fd;
      return;
    }
    ::close(fd);
  }
  usage_error("cannot hold ", file.string(), ": a cleanup removes the directory again and again");
}

void Snapshotter::record_checkpoint_dir() {
  const std::string text =
      directory_record(fs::absolute(o_.checkpoint_dir).lexically_normal().string(), o_.checkpoint_dir);
  const fs::path file = fs::path(run_dir_) / kOwnerFile;
  if (ckpt::read_small_file(file.string()) != text)
    ckpt::write_file_atomically(file.string(), std::vector<char>(text.begin(), text.end()));
}

bool Snapshotter::due(int64_t step) const {
  if (!enabled_ || ctx_.rank() != 0) return false;
  return step % every_ == 0;
}

bool Snapshotter::settle() {
  try {
    writer_->wait();
    if (failed_at_ && writer_->completed().first > *failed_at_) {
      failed_at_.reset();
      log::info("snapshots are written again");
    }
    return true;
  } catch (const Error& e) {
    // Said once, as the output files' failures: a full memory file system fails every try.
    if (!failed_at_) {
      failed_at_ = writer_->completed().first;
      log::warn("a snapshot could not be written (", e.what(), "); training goes on, the previous one stays, and ",
                "so do the tries (said once, until one is written)");
    }
    return false;
  }
}

void Snapshotter::take(const RunPosition& at) {
  if (!enabled_ || at.step == last_) return;
  const auto t0 = Clock::now();
  const int64_t steps_since = at.step - std::max<int64_t>(last_, 0);
  last_ = at.step;
  // Under auto, a host whose last snapshot is still being written skips this one rather than
  // stall the step loop; a spacing the user chose is kept, as checkpoints are, by waiting for
  // the write.
  const bool write = writes() && (o_.snapshot_every_steps > 0 || writer_->idle()) && settle();
  ckpt::Checkpoint c;
  if (write) {
    c = writer_->recycled();
    // The last snapshot's record, handed back with it, differs only in the position.
    const auto id = c.meta.find("run_id");
    if (id == c.meta.end() || id->second != run_id_) {
      record_run(c, o_, model_, ctx_.world_size(), at);
      c.meta["run_id"] = run_id_;
    } else {
      record_position(c, at);
    }
    engine_.begin_snapshot(c);  // the parameters and momentum: on the writer's thread
  }
  if (write) writer_->submit(std::move(c), at.step, [this] { engine_.complete_snapshot(); });
  ++taken_;
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  stall_ += took;
  // Under auto, rank 0 spaces them so that their copies cost under 1% of the steps between.
  const double since = std::chrono::duration<double>(t0 - last_time_).count();
  if (o_.snapshot_every_steps < 0 && steps_since > 0 && since > 0) {
    const double step_seconds = since / static_cast<double>(steps_since);
    every_ = std::clamp<int64_t>(static_cast<int64_t>(std::ceil(took / (0.01 * step_seconds))), 1, 1000);
  }
  last_time_ = Clock::now();
}

bool Snapshotter::take_and_wait(const RunPosition& at) {
  if (!enabled_) return false;
  if (writes()) settle();  // nothing in flight: this one is written, not skipped
  if (at.step == last_) last_ = -1;
  take(at);
  double failed = writes() && !settle() ? 1 : 0;
  if (ctx_.world_size() > 1) ctx_.world().allreduce_sum(&failed, 1);
  return failed == 0;
}

void Snapshotter::wait() {
  if (writes()) settle();
}

void Snapshotter::remove_all() {
  // The process that holds this host's folder (local rank 0, which checked it is the user's own)
  // removes it, also where snapshots were switched off for this attempt: an earlier attempt's
  // snapshots may be in it, which nothing would resume now.
  if (in_use_fd_ < 0) return;
  if (writes()) settle();
  writer_.reset();
  store_.reset();
  // Only when no other running hpctrain holds the folder too (a second job of this run on this
  // host, an earlier attempt still alive): the lock taken exclusively, and held across the
  // removal, as the cleanup does, so that none takes it up meanwhile.
  const int fd = std::exchange(in_use_fd_, -1);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    log::warn("kept the snapshots ", run_dir_, ": another running hpctrain of this run uses them (its end, or "
              "hpctrain clean-snapshots after it, frees them)");
    return;
  }
  std::error_code ec;
  fs::remove_all(run_dir_, ec);
  ::close(fd);
  if (ec) log::warn("cannot remove the finished run's snapshots ", run_dir_, ": ", ec.message());
}

namespace {

// What clean-snapshots is asked to do: where, and which runs' snapshots; its options as given
// (older, run_id, all), from which `what` is made.
struct CleanRequest {
  std::string dir;  // --snapshot-dir; empty: the default
  std::string older, run_id;
  bool all = false;
  SnapshotCleaning what;
};

// The checks of what was given, and what to clean from it.
void check_clean_request(CleanRequest& r, const boost::program_options::variables_map& vm) {
  HPC_REQUIRE(vm.count("older-than") + vm.count("run-id") + (r.all ? 1 : 0) <= 1,
              "hpctrain clean-snapshots takes one of --older-than, --all and --run-id");
  HPC_REQUIRE(!vm.count("run-id") || is_run_id(r.run_id), "--run-id takes a run id (16 hex digits, as ",
              "CHECKPOINT_DIR/run-id holds), got '", r.run_id, "'");
  HPC_REQUIRE(!vm.count("snapshot-dir") || !r.dir.empty(),
              "--snapshot-dir is empty (an unset variable?): give the directory, or leave it out for the default");
  require_not_root_dir(r.dir, "--snapshot-dir");
  r.what.all = r.all;
  r.what.run_id = r.run_id;
  r.what.ended_runs = !r.all && r.run_id.empty();
  if (!r.older.empty()) r.what.older_than = parse_duration(r.older, "older-than");
  HPC_REQUIRE(r.what.older_than <= kLongestWait, "--older-than must be at most 1000h, got ",
              show_duration(r.what.older_than));
}

// clean-snapshots' options, checked on every rank alike; nullopt when --help was handled.
std::optional<CleanRequest> parse_clean_snapshots(int argc, const char* const* argv, dist::ProcessContext& ctx) {
  using R = CleanRequest;
  static const std::vector<options::Entry<R>> table{
      options::path("snapshot-dir", &R::dir, "where the snapshots are (default /dev/shm/hpctrain-UID, hpctrain's)"),
      // Blank (--older-than "$AGE", unset) is refused: it cleaned as if the option were not given.
      options::path("older-than", &R::older,
                    "remove those last written longer ago than this (90s, 10m, 2h; default 1h)",
                    options::Presence::NotBlank),
      options::flag("all", &R::all, "remove every run's that no running hpctrain uses, whatever its age"),
      options::path("run-id", &R::run_id,
                    "remove this run's alone (the id in CHECKPOINT_DIR/run-id), whatever its age"),
  };
  return parse_subcommand_options<R>(
      argc, argv, ctx,
      "Usage: hpctrain clean-snapshots [--snapshot-dir DIR] [--older-than DURATION | --all | --run-id ID]\n"
      "Frees the host memory held by this user's snapshots that no relaunch needs: by default those of runs\n"
      "that failed or were killed, last written over an hour ago (as long as hpctrain keeps them), and those of\n"
      "runs that have ended since on other hosts (their checkpoint directory says so). Snapshots a\n"
      "running hpctrain uses are never removed. Under mpirun it cleans once on each host (the host's first\n"
      "rank): mpirun --map-by ppr:1:node hpctrain clean-snapshots. Exit code 0, also when nothing was there",
      table, {}, check_clean_request);
}

// Cleans `parent`, this user's folder of snapshots on this host, and says what it freed and kept.
void clean_host_snapshots(const dist::ProcessContext& ctx, const std::string& parent, const SnapshotCleaning& what) {
  struct stat st {};
  if (::lstat(parent.c_str(), &st) != 0) {
    HPC_REQUIRE(errno == ENOENT, "cannot read ", parent, ": ", std::strerror(errno));
    log::write_standard_output(detail::concat("hpctrain: ", ctx.host(), ": no snapshots (no ", parent, ")\n"));
    return;
  }
  HPC_REQUIRE(S_ISDIR(st.st_mode), parent, " is not a directory");
  HPC_REQUIRE(st.st_uid == ::geteuid(), parent, " belongs to another user (uid ", st.st_uid,
              "): each user cleans their own");
  const CleanedSnapshots c = clean_snapshots(parent, what);
  log::write_standard_output(detail::concat(
      "hpctrain: ", ctx.host(), ": removed the snapshots of ", c.removed, " run(s), ",
      format_bytes(static_cast<double>(c.freed_bytes)), " freed; kept ", c.kept_in_use, " in use and ", c.kept_young, " ",
      what.all || !what.run_id.empty() ? std::string("not asked for")
                                       : detail::concat("last written within ", show_duration(what.older_than)),
      " (", format_bytes(static_cast<double>(c.kept_bytes)), ") in ", parent, "\n"));
}

// What persist-snapshot is asked: the run's checkpoint directory, where its snapshots are, and how
// long to wait for the directory's lock.
struct PersistRequest {
  std::string checkpoint_dir, snapshot_dir;
  double lock_wait = 0;
};

std::optional<PersistRequest> parse_persist_snapshot(int argc, const char* const* argv, dist::ProcessContext& ctx) {
  using R = PersistRequest;
  static const std::vector<options::Entry<R>> table{
      options::path("checkpoint-dir", &R::checkpoint_dir, "the run's checkpoint directory (its run-id names the run)",
                    options::Presence::Required),
      options::path("snapshot-dir", &R::snapshot_dir, "where the snapshots are (default /dev/shm/hpctrain-UID, hpctrain's)"),
      options::duration("checkpoint-lock-wait", &R::lock_wait,
                        "while a live run holds --checkpoint-dir's lock, wait this long for it before refusing: 30s, 2m",
                        [](double v, const std::string& name) {
                          HPC_REQUIRE(v >= 0 && v <= 3600, name, " must be between 0 and 1h, got ", v, " s");
                        }),
  };
  const auto check = [](R& r, const boost::program_options::variables_map& vm) {
    HPC_REQUIRE(!vm.count("snapshot-dir") || !r.snapshot_dir.empty(),
                "--snapshot-dir is empty (an unset variable?): give the directory, or leave it out for the default");
    require_not_root_dir(r.snapshot_dir, "--snapshot-dir");
    require_not_root_dir(r.checkpoint_dir, "--checkpoint-dir");
  };
  return parse_subcommand_options<R>(
      argc, argv, ctx,
      "Usage: hpctrain persist-snapshot --checkpoint-dir DIR [--snapshot-dir S] [--checkpoint-lock-wait DURATION]\n"
      "Writes the run's newest snapshot in host memory into its checkpoint directory, as the checkpoint of its\n"
      "step, where it is newer than the directory's newest valid checkpoint (one of its step that is damaged is\n"
      "replaced): steps that only host memory held (a job\n"
      "stopped to change its hosts, or ended by failures) then survive the hosts, for a job requeued onto other\n"
      "nodes or resumed after they are gone. hpcrun does this by itself as a job ends. Under mpirun every host\n"
      "offers its newest valid snapshot (the host's first rank) and the lowest rank holding the newest writes it:\n"
      "mpirun --map-by ppr:1:node hpctrain persist-snapshot --checkpoint-dir DIR. The directory's lock is taken\n"
      "for the write: a run that trains there now is left alone. Exit code 0, also when nothing was newer",
      table, {}, check);
}

// The run whose snapshots go into `dir`: its run-id, which must be the directory's own (a copy's
// names the original's run, whose snapshots are not this directory's state). Usage error otherwise.
std::string run_of_directory(const std::string& dir) {
  std::error_code ec;
  HPC_REQUIRE(fs::is_directory(dir, ec), "--checkpoint-dir ", dir, " is not a directory",
              ec ? ": " + ec.message() : std::string());
  const RunIdFile file = read_run_id(dir);
  HPC_REQUIRE(!file.id.empty(), dir, " holds no run id (", (fs::path(dir) / kRunIdFile).string(),
              "): no run that keeps snapshots in host memory has trained there");
  HPC_REQUIRE(file.inode.empty() || file.inode == directory_inode(dir), (fs::path(dir) / kRunIdFile).string(),
              " was written in another directory (this is a copy of it?): the snapshots of run ", file.id,
              " are that directory's state, not this one's");
  return file.id;
}

// Writes `snapshot` (from `from`) into `dir` as the checkpoint of its step, under the directory's
// lock, and says so.
void persist(const dist::ProcessContext& ctx, const PersistRequest& r, const std::string& from,
             const ckpt::Checkpoint& snapshot) {
  const std::unique_ptr<ckpt::DirectoryLock> lock =
      ckpt::DirectoryLock::acquire(r.checkpoint_dir, r.lock_wait, [] { return false; });
  // Taken: no run writes the directory now. Its newest checkpoint may have grown since it was
  // listed (a run that ended meanwhile), and one as new holds at least this state.
  const int64_t step = snapshot.integer("step");
  const int64_t newest = ckpt::newest_valid_step(r.checkpoint_dir);
  if (newest >= step) {
    log::write_standard_output(detail::concat("hpctrain: nothing to keep: ", r.checkpoint_dir,
                                              " has a checkpoint as new (step ", newest, ") since it was read\n"));
    lock->release(false);
    return;
  }
  ckpt::CheckpointStore store(r.checkpoint_dir, std::numeric_limits<int>::max());  // removes no checkpoint
  store.guard_with(lock.get());
  const ckpt::Encoded bytes(snapshot);
  // A file of this step there is damaged (the newest valid one is older): the snapshot, the same
  // step's state, takes its place.
  std::error_code ec;
  const bool replaces = fs::exists(fs::path(r.checkpoint_dir) / ckpt::CheckpointStore::file_name(step), ec);
  const std::string path = store.write(bytes, step);
  lock->release(false);
  log::write_standard_output(detail::concat("hpctrain: ", ctx.host(), ": kept the snapshot of step ", step, " (",
                                            from, ") as ", path, " (",
                                            format_bytes(static_cast<double>(bytes.size())), ")",
                                            replaces ? ", in place of a damaged file of that step" : "", "\n"));
}

}  // namespace

int run_clean_snapshots(int argc, const char* const* argv, dist::ProcessContext& ctx) {
  const std::optional<CleanRequest> request = parse_clean_snapshots(argc, argv, ctx);
  if (!request) return kExitSuccess;
  const std::string parent = request->dir.empty() ? default_snapshot_parent() : request->dir;
  dist::collectively(ctx, [&] {  // once on each host: its first rank
    if (ctx.local_rank() == 0) clean_host_snapshots(ctx, parent, request->what);
  });
  return kExitSuccess;
}

int run_persist_snapshot(int argc, const char* const* argv, dist::ProcessContext& ctx) {
  const std::optional<PersistRequest> request = parse_persist_snapshot(argc, argv, ctx);
  if (!request) return kExitSuccess;
  std::string run_id;
  int64_t newest = -1;
  dist::collectively(ctx, [&] {
    if (ctx.rank() != 0) return;
    run_id = run_of_directory(request->checkpoint_dir);
    newest = ckpt::newest_valid_step(request->checkpoint_dir);  // as a resume finds it: damaged ones passed by
  });
  dist::Communicator& comm = ctx.world();
  run_id = dist::broadcast_string(comm, run_id, 0);
  if (comm.size() > 1) comm.broadcast(&newest, sizeof newest, 0);
  const std::string parent = request->snapshot_dir.empty() ? default_snapshot_parent() : request->snapshot_dir;
  Found mine;
  dist::collectively(ctx, [&] {  // once on each host: its first rank
    if (ctx.local_rank() == 0) mine = newest_snapshot((fs::path(parent) / run_id).string(), run_id, newest, {});
  });
  const int root = newest_holder(comm, mine);  // the newest of any host, from the lowest rank holding it
  if (root < 0) {
    if (ctx.rank() == 0)
      log::write_standard_output(detail::concat(
          "hpctrain: nothing to keep: no snapshot of run ", run_id, " in ", parent, " is newer than ",
          request->checkpoint_dir, "'s newest valid checkpoint (",
          newest < 0 ? std::string("none") : detail::concat("step ", newest), ")\n"));
    return kExitSuccess;
  }
  dist::collectively(ctx, [&] {
    if (ctx.rank() == root) persist(ctx, *request, mine->first, mine->second);
  });
  return kExitSuccess;
}

}  // namespace hpc::train

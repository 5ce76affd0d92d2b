#include "train/snapshots.hpp"

#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "core/cpus.hpp"
#include "core/error.hpp"
#include "core/hash.hpp"
#include "core/log.hpp"
#include "dist/agree.hpp"

namespace hpc::train {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

constexpr const char* kRunIdFile = "run-id";
constexpr size_t kRunIdLength = 16;  // hex digits
// Snapshot directories of other runs are removed once untouched for this long: a job that is
// requeued onto the node within a day still finds its state.
constexpr auto kLeftoverAge = std::chrono::hours(24);

bool is_run_id(const std::string& s) {
  return s.size() == kRunIdLength && std::all_of(s.begin(), s.end(), [](char c) { return std::isxdigit(c); });
}

std::string new_run_id() {
  std::random_device device;
  const uint64_t v = (static_cast<uint64_t>(device()) << 32) ^ device() ^
                     static_cast<uint64_t>(Clock::now().time_since_epoch().count()) ^ (uint64_t(::getpid()) << 16);
  return hex64(v);
}

// CHECKPOINT_DIR/run-id's content, "" when there is none (or it is not an id).
std::string read_run_id(const std::string& dir) {
  std::ifstream in(fs::path(dir) / kRunIdFile);
  std::string id;
  if (!(in >> id) || !is_run_id(id)) return "";
  return id;
}

std::string format_bytes(double bytes) {
  char buf[32];
  const char* unit[] = {"B", "kB", "MB", "GB", "TB"};
  int u = 0;
  while (bytes >= 1000 && u < 4) bytes /= 1000, ++u;
  std::snprintf(buf, sizeof buf, u ? "%.1f %s" : "%.0f %s", bytes, unit[u]);
  return buf;
}

// Free bytes of the file system holding `dir`, plus what the run's own snapshots there take
// (they are replaced, not added to).
uint64_t room_for_snapshots(const std::string& dir) {
  struct statvfs s {};
  if (::statvfs(dir.c_str(), &s) != 0) return 0;
  uint64_t room = static_cast<uint64_t>(s.f_bavail) * s.f_frsize;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file(ec)) room += e.file_size(ec);
  return room;
}

// The parent of the run directories must be this user's own (in a shared /dev/shm another user
// could have made it, and would then read or replace the state).
void require_own_directory(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  struct stat st {};
  HPC_REQUIRE(::lstat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), "cannot create ", dir.string(),
              ec ? ": " + ec.message() : std::string(": not a directory"));
  HPC_REQUIRE(st.st_uid == ::geteuid(), dir.string(), " belongs to another user (uid ", st.st_uid, ")");
  ::chmod(dir.c_str(), 0700);
}

// This host's newest snapshot that the run can resume, above the newest checkpoint's step;
// every other one on the way is named in a warning.
std::optional<std::pair<std::string, ckpt::Checkpoint>> newest_snapshot(const std::string& run_dir,
                                                                       const std::string& run_id,
                                                                       const TrainOptions& o,
                                                                       const nn::Model<float>& model,
                                                                       int64_t checkpoint_step) {
  std::vector<std::string> files;
  try {
    files = ckpt::list_checkpoints(run_dir);
  } catch (const Error& e) {
    log::warn("snapshots not read: ", e.what());
    return std::nullopt;
  }
  for (const std::string& file : files) {
    try {
      ckpt::Checkpoint c = ckpt::load_checkpoint(file);
      const auto id = c.meta.find("run_id");
      HPC_REQUIRE(id != c.meta.end() && id->second == run_id, "it is of another run (run id ",
                  id == c.meta.end() ? std::string("none") : id->second, ", this run's ", run_id, ")");
      const int64_t step = c.integer("step");
      if (step == checkpoint_step) return std::nullopt;  // the checkpoint holds the same state
      HPC_REQUIRE(step > checkpoint_step, "it is older (step ", step, ") than the newest checkpoint (step ",
                  checkpoint_step, ")");
      check_resumable(c, o, model);
      HPC_REQUIRE(!first_non_finite(c), "it holds a state that is not finite");
      return std::make_pair(file, std::move(c));
    } catch (const Error& e) {
      log::warn("snapshot ", file, " ignored: ", e.what());
    }
  }
  return std::nullopt;
}

}  // namespace

RunIdentity run_identity(dist::ProcessContext& ctx, const TrainOptions& o) {
  RunIdentity r;
  if (o.checkpoint_dir.empty()) return r;
  if (ctx.rank() == 0) {
    r.previous = read_run_id(o.checkpoint_dir);
    r.id = o.resume == ResumeFrom::Auto && !r.previous.empty() ? r.previous : new_run_id();
  }
  r.id = dist::broadcast_string(ctx.world(), r.id, 0);
  r.previous = dist::broadcast_string(ctx.world(), r.previous, 0);
  return r;
}

void record_run_identity(const TrainOptions& o, const RunIdentity& r) {
  if (o.checkpoint_dir.empty() || r.id == r.previous) return;
  const fs::path path = fs::path(o.checkpoint_dir) / kRunIdFile;
  if (o.snapshot_every_steps == 0) {
    // No snapshots, but a new lineage all the same: the old id must not make a later run with
    // snapshots take the old run's for its own.
    std::error_code ec;
    fs::remove(path, ec);
    return;
  }
  const std::string text = r.id + "\n";
  ckpt::write_file_atomically(path.string(), {text.begin(), text.end()});
}

std::string snapshot_run_dir(const TrainOptions& o, const std::string& run_id) {
  if (o.snapshot_every_steps == 0 || o.checkpoint_dir.empty() || run_id.empty()) return "";
  const std::string parent =
      o.snapshot_dir.empty() ? "/dev/shm/hpctrain-" + std::to_string(::geteuid()) : o.snapshot_dir;
  return (fs::path(parent) / run_id).string();
}

uint64_t host_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), size = ::sysconf(_SC_PAGE_SIZE);
  uint64_t bytes = pages > 0 && size > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(size) : 0;
  // A job's memory limit (Slurm's --mem, a container's) counts the snapshots' tmpfs pages too:
  // a share of the host would let them push the job over it.
  if (const std::optional<double> limit = cpus::cgroup_memory_limit())
    bytes = std::min<uint64_t>(bytes, static_cast<uint64_t>(*limit));
  return bytes;
}

uint64_t memory_budget(const std::string& spec, uint64_t host_memory) {
  size_t used = 0;
  double v = -1;
  try {
    v = std::stod(spec, &used);
  } catch (...) {
    used = 0;
  }
  const std::string unit = spec.substr(std::min(used, spec.size()));
  static const std::pair<const char*, double> kUnits[] = {{"", 1.0},          {"K", 1024.0},
                                                          {"M", 1048576.0},   {"G", 1073741824.0},
                                                          {"T", 1099511627776.0}};
  if (used > 0 && std::isfinite(v) && v >= 0) {
    if (unit == "%" && v <= 100) return static_cast<uint64_t>(static_cast<double>(host_memory) * v / 100);
    for (const auto& [name, factor] : kUnits)
      if (unit == name && v * factor < 1.8e19) return static_cast<uint64_t>(v * factor);
  }
  usage_error("--snapshot-max-memory takes a size (512M, 4G: bytes with K, M, G or T) or a share of the host's "
              "memory (25%), got '", spec, "'");
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
                             const std::string& run_dir, const std::string& run_id) {
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
  if (ctx.local_rank() == 0) mine = newest_snapshot(run_dir, run_id, o, model, shared_step);
  // The newest snapshot of any host, from the lowest rank that holds it; else the checkpoint.
  const uint64_t my_step = mine ? static_cast<uint64_t>(mine->second.integer("step") + 1) : 0;
  const std::vector<uint64_t> steps = comm.size() > 1 ? comm.allgather(my_step) : std::vector<uint64_t>{my_step};
  int root = 0;
  for (int r = 1; r < static_cast<int>(steps.size()); ++r)
    if (steps[r] > steps[root]) root = r;
  const bool snapshot = steps[root] > 0;
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
  const size_t state_bytes = ckpt::encode(probe).size();
  bool ok = true;
  if (ctx_.local_rank() == 0) {
    try {
      require_own_directory(fs::path(run_dir_).parent_path());
      remove_leftovers(previous_run_id);
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

Snapshotter::~Snapshotter() = default;

void Snapshotter::check_budget(size_t state_bytes) {
  // A snapshot being written beside the last one: twice the state.
  const uint64_t need = 2 * static_cast<uint64_t>(state_bytes);
  const uint64_t budget = memory_budget(o_.snapshot_max_memory, host_memory_bytes());
  HPC_REQUIRE(need <= budget, "they need ", format_bytes(static_cast<double>(need)), " (twice the state of ",
              format_bytes(static_cast<double>(state_bytes)), ") and --snapshot-max-memory allows ",
              format_bytes(static_cast<double>(budget)), " (", o_.snapshot_max_memory, ")");
  const uint64_t room = room_for_snapshots(run_dir_);
  HPC_REQUIRE(need <= room, "they need ", format_bytes(static_cast<double>(need)), " and ", run_dir_, " has ",
              format_bytes(static_cast<double>(room)), " free");
}

void Snapshotter::remove_leftovers(const std::string& previous_run_id) {
  const fs::path parent = fs::path(run_dir_).parent_path();
  std::error_code ec;
  const auto now = fs::file_time_type::clock::now();
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    const std::string name = e.path().filename().string();
    if (!is_run_id(name) || e.path() == fs::path(run_dir_) || !e.is_directory(ec)) continue;
    const bool replaced = name == previous_run_id;  // the lineage a fresh start in this directory ended
    const auto written = fs::last_write_time(e.path(), ec);
    if (!replaced && (ec || now - written < kLeftoverAge)) continue;
    fs::remove_all(e.path(), ec);
    if (ec) log::warn("cannot remove the snapshots ", e.path().string(), ": ", ec.message());
    else log::info("removed the snapshots of ", replaced ? "the run this one replaced" : "a run untouched for a day",
                   ": ", e.path().string());
  }
}

bool Snapshotter::due(int64_t step) const {
  if (!enabled_ || ctx_.rank() != 0) return false;
  return step % every_ == 0;
}

bool Snapshotter::settle() {
  try {
    writer_->wait();
    return true;
  } catch (const Error& e) {
    log::warn("a snapshot could not be written (", e.what(), "); training goes on, the previous one stays");
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
  if (!enabled_ || !writes()) return;
  settle();
  writer_.reset();
  store_.reset();
  std::error_code ec;
  fs::remove_all(run_dir_, ec);
  if (ec) log::warn("cannot remove the finished run's snapshots ", run_dir_, ": ", ec.message());
}

}  // namespace hpc::train

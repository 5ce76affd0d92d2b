#include "train/run/boundary.hpp"

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/error.hpp"
#include "core/exit_codes.hpp"
#include "core/log.hpp"
#include "dist/agree.hpp"
#include "train/stop/signals.hpp"

namespace hpc::train {

TestHook TestHook::from_environment(const char* variable, int default_signal) {
  TestHook k;
  if (const char* v = std::getenv(variable)) {
    k.step = std::atoll(v);
    const char* name = std::strchr(v, ':');
    k.signal = name ? signal_number_of(name + 1) : default_signal;
    HPC_REQUIRE(k.signal != 0, variable, ": unknown signal in '", v, "'");
    if (const char* at = std::strchr(v, '@')) k.rank = std::atoi(at + 1);
  }
  return k;
}

TestHooks::TestHooks(int rank)
    : rank_(rank),
      kill_(TestHook::from_environment("HPCTRAIN_TEST_KILL_AFTER_STEP", SIGKILL)),
      signal_(TestHook::from_environment("HPCTRAIN_TEST_SIGNAL_AFTER_STEP", SIGTERM)) {
  if (const char* v = std::getenv("HPCTRAIN_TEST_SLOW_RANK"); v && std::atoi(v) == rank_)
    if (const char* ms = std::strchr(v, ':')) slow_ms_ = std::atoi(ms + 1);
}

void TestHooks::slow_down() const {
  if (slow_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(slow_ms_));
}

// What the hooks below wait for before they fire: this rank's checkpoint writes. A test that
// holds them before their rename (HPCTRAIN_TEST_PAUSE_BEFORE_RENAME) fires in the middle of one:
// then the write in flight, if any, is awaited until it sits in that pause, its temporary file
// whole (on a loaded machine a kill one step later came before the writer had created it). Only
// this writer's pause ends the wait: in a run that also takes snapshots, their writer pauses too.
static void finish_writes(ckpt::AsyncWriter* writer) {
  if (!writer) return;
  if (!std::getenv("HPCTRAIN_TEST_PAUSE_BEFORE_RENAME")) return writer->wait();
  while (!writer->idle() && !writer->paused_before_rename())
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

void TestHooks::signal_after(int64_t step, ckpt::AsyncWriter* writer) const {
  if (!signal_.fires(step, rank_)) return;
  finish_writes(writer);
  StopSignals::raise_and_wait(signal_.signal);
}

void TestHooks::kill_after(int64_t step, ckpt::AsyncWriter* writer, dist::Communicator& comm) const {
  if (kill_.step != step) return;
  finish_writes(writer);
  if (comm.size() > 1) comm.barrier();
  if (kill_.rank == rank_) std::raise(kill_.signal);
}

int shard_of(int rank, int world) {
  const char* v = std::getenv("HPCTRAIN_TEST_WRONG_SHARD");
  return v && std::atoi(v) == rank ? (rank + 1) % world : rank;
}

StopAsked stop_asked(dist::Communicator& comm) {
  const auto mine = static_cast<uint64_t>(StopSignals::signal_number());
  const std::vector<uint64_t> all = comm.size() > 1 ? comm.allgather(mine) : std::vector<uint64_t>{mine};
  StopAsked s;
  for (size_t r = all.size(); r-- > 0;)
    if (all[r] != 0) s = {static_cast<int>(all[r]), static_cast<int>(r), s.ranks + 1};
  return s;
}

std::string cause_of(const StopAsked& s, int world) {
  return s.ranks == world ? signal_name(s.signal) : detail::concat(signal_name(s.signal), " to rank ", s.rank);
}

int stop_exit_code(const TrainOptions& o, const StopAsked& s) {
  return o.checkpoint_dir.empty() ? 128 + s.signal : kExitCheckpointed;
}

std::unique_ptr<ckpt::DirectoryLock> lock_directory(dist::ProcessContext& ctx, const TrainOptions& o, bool* locked) {
  std::unique_ptr<ckpt::DirectoryLock> lock;
  dist::collectively(ctx, [&] {
    if (ctx.rank() == 0 && !o.checkpoint_dir.empty())
      lock = ckpt::DirectoryLock::acquire(
          o.checkpoint_dir, o.checkpoint_lock_wait_seconds, [] { return StopSignals::requested(); },
          ckpt::hpcrun_owner_fields(ckpt::hpcrun_token_from_env(), ckpt::hpcrun_attempt_from_env()));
  });
  uint64_t got = lock || o.checkpoint_dir.empty() ? 1 : 0;
  if (ctx.world_size() > 1) ctx.world().broadcast(&got, sizeof got, 0);
  *locked = got != 0;
  return lock;
}

std::unique_ptr<ckpt::CheckpointStore> open_store(dist::ProcessContext& ctx, const TrainOptions& o) {
  std::unique_ptr<ckpt::CheckpointStore> store;
  dist::collectively(ctx, [&] {
    if (ctx.rank() == 0 && !o.checkpoint_dir.empty())
      store = std::make_unique<ckpt::CheckpointStore>(o.checkpoint_dir, o.keep_checkpoints);
  });
  return store;
}

void diverged(const TrainOptions& o, const std::string& what, bool before_any_update) {
  // Parameters read from a file (finite, or they would have been refused, but of any size): the
  // file's doing, not hpctrain's.
  if (before_any_update && !o.init_from.empty())
    throw dist::CollectiveError(ErrorKind::Usage,
                                detail::concat(what, " with the parameters of --init-from ", o.init_from,
                                               ", before any update: its weights do not suit this model and data"));
  if (before_any_update)
    throw dist::CollectiveError(ErrorKind::Internal,
                                detail::concat("internal error at ", __FILE__, ":", __LINE__, ": ", what,
                                               " before any update of the initial parameters (not the options' doing)"));
  throw dist::CollectiveError(ErrorKind::Usage,
                              detail::concat("training diverged: ", what, "; lower --lr (now ", o.lr,
                                             ") or warm up to it (--warmup-epochs); no checkpoint holds this state"));
}

void require_finite_state(dist::Communicator& comm, Engine& engine, const TrainOptions& o, int64_t after_step,
                          bool check) {
  constexpr StatePart kParts[] = {StatePart::Parameters, StatePart::Momentum, StatePart::NormStatistics};
  double bad[3] = {0, 0, 0};  // by part: the first part any rank found
  if (check)
    if (const std::optional<StatePart> part = engine.first_non_finite()) bad[static_cast<int>(*part)] = 1;
  if (comm.size() > 1) comm.allreduce_sum(bad, 3);
  for (int i = 0; i < 3; ++i)
    if (bad[i] > 0)
      diverged(o, detail::concat(describe(kParts[i]), " are not finite after step ", after_step,
                                 ", though its loss still was"), false);
}

StepAgreement StepAgreement::reach(dist::Communicator& comm, bool checkpoint_due, bool snapshot_due, double loss,
                                    bool lost_directory, std::span<double> summed) {
  constexpr size_t kFlags = 5;
  std::vector<double> flags = {checkpoint_due ? 1.0 : 0.0, snapshot_due ? 1.0 : 0.0,
                               StopSignals::requested() ? 1.0 : 0.0, std::isfinite(loss) ? 0.0 : 1.0,
                               lost_directory ? 1.0 : 0.0};
  flags.insert(flags.end(), summed.begin(), summed.end());
  if (comm.size() > 1) comm.allreduce_sum(flags.data(), static_cast<int64_t>(flags.size()));
  std::copy(flags.begin() + kFlags, flags.end(), summed.begin());
  return {flags[0] > 0, flags[1] > 0, flags[2] > 0, flags[3] > 0, flags[4] > 0};
}

void lost_directory(const TrainOptions& o, const std::string& how) {
  throw dist::CollectiveError(ErrorKind::Usage,
                              detail::concat("the checkpoint directory ", o.checkpoint_dir, " is no longer this run's: ",
                                             how.empty() ? "rank 0 lost its lock on it" : how,
                                             "; stopping without writing anything more there"));
}

Heartbeat::Heartbeat(const ckpt::CheckpointStore* store, std::string resumed)
    : store_(store), resumed_(std::move(resumed)) {
  if (store_) ckpt::prepare_final_heartbeat(store_->dir(), resumed_);
}

Heartbeat::~Heartbeat() {
  if (store_) ckpt::disarm_final_heartbeat();
}

void Heartbeat::beat(int64_t step, int64_t epochs_done, const std::function<std::string()>& extra, bool now) {
  if (!store_) return;
  if (beaten_) ckpt::arm_final_heartbeat(step, epochs_done);  // where a stop at once finds the run
  if ((!now && seconds_since(last_) < 1.0) || !store_->owned()) return;  // owned() stats the lock: once a second
  ckpt::write_heartbeat(store_->dir(), step, epochs_done, "training", extra ? resumed_ + extra() : resumed_);
  ckpt::arm_final_heartbeat(step, epochs_done);
  beaten_ = true;
  last_ = Clock::now();
}

void Heartbeat::stepped(int64_t step, int64_t epochs_done) {
  if (store_ && beaten_) ckpt::arm_final_heartbeat(step, epochs_done);
}

void Heartbeat::writing(int64_t step, int64_t epochs_done, int64_t checkpoint_step, uint64_t synced, uint64_t total) {
  beat(step, epochs_done, [&] {
    return detail::concat("checkpoint_step=", checkpoint_step, "\ncheckpoint_bytes_synced=", synced,
                          "\ncheckpoint_bytes=", total, "\n");
  });
}

void Heartbeat::last(int64_t step, int64_t epochs_done, const char* state, const std::string& extra) {
  if (store_ && store_->owned()) ckpt::write_heartbeat(store_->dir(), step, epochs_done, state, resumed_ + extra);
  // After the write: a stop at once meanwhile leaves "stopped", never "training".
  if (store_) ckpt::disarm_final_heartbeat();
  beaten_ = false;
}

Checkpointer::Checkpointer(dist::ProcessContext& ctx, const TrainOptions& o,
                           std::unique_ptr<ckpt::CheckpointStore> store, Engine& engine, ModelIdentity model,
                           OnWait on_wait)
    : ctx_(ctx),
      o_(o),
      store_(std::move(store)),
      engine_(engine),
      model_(std::move(model)),
      on_wait_(std::move(on_wait)) {
  if (store_) writer_ = std::make_unique<ckpt::AsyncWriter>(*store_);
}

bool Checkpointer::due_by_clock() const {
  return ctx_.rank() == 0 && o_.checkpoint_interval_seconds > 0 &&
         seconds_since(last_time_) >= o_.checkpoint_interval_seconds;
}

bool Checkpointer::due_at_step(int64_t step) const {
  return o_.checkpoint_every_steps > 0 && step % o_.checkpoint_every_steps == 0;
}

void Checkpointer::save(const RunPosition& at, bool last) {
  // The same step saved again only where it stands elsewhere: the final checkpoint of a run that
  // --max-steps ended mid-epoch, on a step a periodic checkpoint had just taken, stands after the
  // last epoch (as the done event's state_checksum says); it stayed the mid-epoch one.
  if (o_.checkpoint_dir.empty() || (last_saved_ && at.step == last_saved_->step && at.epoch == last_saved_->epoch &&
                                     at.step_in_epoch == last_saved_->step_in_epoch))
    return;
  const auto t0 = Clock::now();
  require_finite_state(ctx_.world(), engine_, o_, at.step, writer_ != nullptr);
  await_writes();  // the last one's
  last_saved_ = at;
  dist::collectively(ctx_, [&] {
    if (!writer_) return;
    ckpt::Checkpoint snapshot;
    try {
      snapshot = writer_->recycled();
    } catch (const Error& e) {
      if (!last) throw;
      log::warn("an earlier checkpoint could not be written (", e.what(), "); writing this one, of step ", at.step,
                ", all the same");
      snapshot = writer_->recycled();  // the failure was taken: the writer is idle
    }
    record_run(snapshot, o_, model_, ctx_.world_size(), at);
    engine_.snapshot(snapshot);
    writer_->submit(std::move(snapshot), at.step);
  });
  stall_ += seconds_since(t0);
  last_time_ = Clock::now();
  ++written_;
}

// Rank 0's write in flight waited for in slices, every rank told after each how far it came: a
// chunk synced is progress to every rank's step watchdog, so a checkpoint that a slow file system
// takes longer than --step-timeout to write is not killed as a hang, while one that makes no
// progress still is. Each slice is an allgather, not a broadcast from rank 0, which may finish at
// the root before the peers have it: rank 0 would go on feeding its watchdog with its peers dead.
// The same number of slices on every rank (all go by rank 0's word); a failure stays in the
// writer for the collective that follows to throw.
void Checkpointer::await_writes() {
  if (o_.checkpoint_dir.empty() || !last_saved_) return;
  const double timeout = std::min(o_.step_timeout_seconds > 0 ? o_.step_timeout_seconds : 4.0,
                                  o_.start_timeout_seconds > 0 ? o_.start_timeout_seconds : 4.0);
  const double slice = std::clamp(timeout / 4, 0.05, 1.0);
  WriteWait w{last_saved_->step};
  do {
    uint64_t word = 0;
    if (writer_) {
      const bool done = writer_->wait_for(slice);
      const uint64_t chunks = writer_->progress().chunks.load();
      word = writer_->progress().synced.load() << 2 | (chunks != chunks_seen_ ? 2 : 0) | (done ? 1 : 0);
      chunks_seen_ = chunks;
      w.total = writer_->progress().total.load();
    }
    if (ctx_.world_size() > 1) word = ctx_.world().allgather(word)[0];
    w.synced = word >> 2;
    w.progressed = (word & 2) != 0;
    w.done = (word & 1) != 0;
    if (on_wait_) on_wait_(w);
  } while (!w.done);
}

void Checkpointer::wait_for_writes(const std::string& doing) {
  await_writes();
  dist::collectively(ctx_, [&] {
    if (!writer_) return;
    try {
      writer_->wait();
    } catch (const Error& e) {
      throw Error(e.kind(), doing + ", but its checkpoint could not be written: " + e.what());
    }
  });
}

}  // namespace hpc::train

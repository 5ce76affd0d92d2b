// The step boundary: what happens between two training steps, each its own small object. Every
// rank agrees on whether to stop, whether a checkpoint is due and whether the loss was finite
// (StepAgreement); checkpoints are handed to the background writer (Checkpointer); rank 0 tells
// launchers it is alive (Heartbeat); the tests' hooks kill or signal a rank there (TestHooks).
// The set-up phase (setup.hpp) uses the stop and store helpers too.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "ckpt/dir_lock.hpp"
#include "ckpt/store.hpp"
#include "dist/process.hpp"
#include "train/engine/engine.hpp"
#include "train/options/options.hpp"
#include "train/state/checkpointing.hpp"

namespace hpc::train {

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Test hooks for the resume and watchdog tests: HPCTRAIN_TEST_KILL_AFTER_STEP=k[@r][:stop]
// makes rank r (0 by default) die by SIGKILL right after global step k, as a lost node would
// (or stop by SIGSTOP, as a hung one); HPCTRAIN_TEST_SIGNAL_AFTER_STEP=k[@r][:NAME] sends it
// SIGTERM (or the signal NAME: usr1, usr2, hup, ...) there instead;
// HPCTRAIN_TEST_SIGNAL_IN_SETUP=phase[@r][:NAME] does that at the end of a set-up phase
// (stopped_in_setup).
struct TestHook {
  int64_t step = -1;  // or the set-up phase
  int rank = 0;
  int signal = 0;
  static TestHook from_environment(const char* variable, int default_signal);
  bool fires(int64_t at, int on_rank) const { return step == at && rank == on_rank; }
};

class TestHooks {
 public:
  explicit TestHooks(int rank);
  // HPCTRAIN_TEST_SIGNAL_AFTER_STEP: right after the step, before the boundary's agreement, so
  // that the stop is taken at this very step. The signalled rank's checkpoint writes finish
  // first, as for kill_after: a signal whose default action ends the process would otherwise
  // take a periodic checkpoint still in flight with it on a loaded machine (a test that runs
  // beside another one saw step 5's missing after a kill at step 9).
  void signal_after(int64_t step, ckpt::AsyncWriter* writer) const;
  // HPCTRAIN_TEST_KILL_AFTER_STEP, at the end of the boundary (collective at that step): what
  // was submitted is durable before the victim dies, so the tests know which checkpoint the
  // resumed run starts from (on a loaded machine the write could otherwise still be in flight;
  // a kill in the middle of a write is what HPCTRAIN_TEST_PAUSE_BEFORE_RENAME is for).
  void kill_after(int64_t step, ckpt::AsyncWriter* writer, dist::Communicator& comm) const;
  // Whether kill_after fires at this step (on any rank).
  bool kills_at(int64_t step) const { return kill_.step == step; }
  // HPCTRAIN_TEST_SLOW_RANK=r:MS: rank r sleeps MS milliseconds after each of its steps, before
  // the boundary's agreement (its own work, as a slow host's: stragglers.hpp's tests).
  void slow_down() const;

 private:
  int rank_;
  TestHook kill_, signal_;
  int slow_ms_ = 0;  // on this rank
};

// The part of each global batch this rank reads: its own, but for the rank r named by
// HPCTRAIN_TEST_WRONG_SHARD=r, which reads rank r+1's (so that one part is read twice and one
// never): the planted bug that shows the data-parallel tests' tolerances catch a wrong shard.
int shard_of(int rank, int world);

// The first stop signal any rank took (0: none), and how many ranks took one. Every rank
// learns the same (collective).
struct StopAsked {
  int signal = 0, rank = 0, ranks = 0;
};
StopAsked stop_asked(dist::Communicator& comm);
// "SIGTERM"; "SIGTERM to rank 1" where only some of several ranks were signalled.
std::string cause_of(const StopAsked& s, int world);
// 75, "requeue me", where the checkpoint directory holds the state to continue from; without
// one nothing is kept, and the code is the signal's, as if it had ended the process.
int stop_exit_code(const TrainOptions& o, const StopAsked& s);

// Rank 0's checkpoint store (none on the other ranks, or without --checkpoint-dir); every rank
// learns whether rank 0 could use the directory (collective).
std::unique_ptr<ckpt::CheckpointStore> open_store(dist::ProcessContext& ctx, const TrainOptions& o);

// Rank 0's lock on --checkpoint-dir (ckpt/dir_lock.hpp), held for the whole run; none on the other
// ranks or without a directory. A directory another live run holds is every rank's usage error
// (after --checkpoint-lock-wait). *locked: on every rank, false when a stop signal ended the wait
// (the directory is then another run's: nothing there may be touched).
std::unique_ptr<ckpt::DirectoryLock> lock_directory(dist::ProcessContext& ctx, const TrainOptions& o, bool* locked);

// Training diverged: a loss, or the state about to be saved, is not finite. Nothing of it is
// saved (the newest checkpoint stays the last good one), and it is the user's learning rate;
// except in a fresh run's first step, whose loss no update has touched: that is hpctrain's bug.
// Thrown on every rank alike.
[[noreturn]] void diverged(const TrainOptions& o, const std::string& what, bool before_any_update);

// Never saved nor reported done: a state that is not finite (the update after a finite loss
// can make it so, and a layer can hide it from later losses). Collective; the ranks that
// `check` look at their engine's state, and every rank learns their verdict.
void require_finite_state(dist::Communicator& comm, Engine& engine, const TrainOptions& o, int64_t after_step,
                          bool check);

// What every rank agrees on at a step boundary, in one all-reduce. `summed`: more figures that
// ride along in it, added up over the ranks in place (each rank fills its own slots, zeros
// elsewhere: the step times of stragglers.hpp), so that they cost no collective of their own.
struct StepAgreement {
  bool checkpoint_due = false;   // rank 0's clock says --checkpoint-interval has passed
  bool snapshot_due = false;     // rank 0's Snapshotter says a snapshot is due
  bool stop = false;             // some rank was asked to stop
  bool loss_not_finite = false;  // on some rank
  bool lost_directory = false;   // rank 0's lock on the checkpoint directory was taken over
  static StepAgreement reach(dist::Communicator& comm, bool checkpoint_due, bool snapshot_due, double loss,
                             bool lost_directory = false, std::span<double> summed = {});
};

// Rank 0's lock on the checkpoint directory is no longer its own (ckpt/dir_lock.hpp: taken
// over, or removed): every rank ends with a usage error, before anything more is written there.
// how: rank 0's DirectoryLock::how_lost() (the others' is empty; rank 0 prints the error).
[[noreturn]] void lost_directory(const TrainOptions& o, const std::string& how);

// Rank 0's DIR/heartbeat (ckpt::write_heartbeat): about once a second while training, and once
// more at the end. Does nothing without a store.
class Heartbeat {
 public:
  // resumed: "resumed_from=STEP\nresumed_source=SOURCE\n" (hpcrun's account of the work a
  // failure cost), added to every beat.
  // From its first beat until its last, a process that ends at once leaves a heartbeat that says so
  // (ckpt::write_final_heartbeat), not "training".
  Heartbeat(const ckpt::CheckpointStore* store, std::string resumed);
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;
  // extra: more lines for this beat (the slowest rank's, stragglers.hpp), asked for only when
  // it is written. now: written whatever the time since the last (a checkpoint's step).
  void beat(int64_t step, int64_t epochs_done, const std::function<std::string()>& extra = {}, bool now = false);
  // A step just done (as the metrics' record of it, final_records::steps_done): where a stop at
  // once finds the run, before the step's boundary beats (a signal may come in between).
  void stepped(int64_t step, int64_t epochs_done);
  // A beat while the run waits for rank 0's checkpoint of `checkpoint_step`, which has come as far
  // as `synced` of `total` bytes written and synced (checkpoint_step=, checkpoint_bytes_synced=,
  // checkpoint_bytes=): a launcher that takes a changed heartbeat for life sees a slow write live.
  // A beat() with those lines: at most once a second, and where a stop at once finds the run.
  void writing(int64_t step, int64_t epochs_done, int64_t checkpoint_step, uint64_t synced, uint64_t total);
  // The last beat: state "done", "stopped" or "failed" (with extra lines such as "exit_code=2\n").
  void last(int64_t step, int64_t epochs_done, const char* state, const std::string& extra = "");

 private:
  const ckpt::CheckpointStore* store_;
  const std::string resumed_;
  Clock::time_point last_ = Clock::now() - std::chrono::hours(1);
  std::atomic<bool> beaten_{false};  // a beat was written, its last not yet (last() may be the watchdog thread's)
};

// The step loop's checkpoints. Rank 0's engine snapshots its state (all ranks hold the same
// parameters and optimizer state; batch-norm statistics are rank 0's, as DDP saves them) and a
// background thread writes it. save() and wait_for_writes() are collective: every rank calls them at the
// same step and learns whether rank 0 could hand the snapshot over or write it.
// How the wait for rank 0's checkpoint writes goes, as every rank learns it once per slice of the
// wait (Checkpointer::await_writes).
struct WriteWait {
  int64_t step = -1;    // the checkpoint's
  uint64_t synced = 0;  // its bytes written and synced
  uint64_t total = 0;   // its size: rank 0's alone knows it (0 elsewhere)
  bool progressed = false;  // a chunk was synced in this slice
  bool done = false;        // nothing left in flight (written, or failed: the wait's caller says which)
};

class Checkpointer {
 public:
  using OnWait = std::function<void(const WriteWait&)>;
  // store: rank 0's (open_store), superseded files already set aside; engine: whose state the
  // checkpoints hold, of `model`. on_wait: called on every rank after each slice of a wait for
  // rank 0's writes (its step watchdog counts a synced chunk as progress, its heartbeat says so).
  Checkpointer(dist::ProcessContext& ctx, const TrainOptions& o, std::unique_ptr<ckpt::CheckpointStore> store,
               Engine& engine, ModelIdentity model, OnWait on_wait = {});
  const ckpt::CheckpointStore* store() const { return store_.get(); }
  ckpt::AsyncWriter* writer() const { return writer_.get(); }
  // Whether rank 0's --checkpoint-interval has passed since the last checkpoint (false on the
  // other ranks: StepAgreement spreads rank 0's answer).
  bool due_by_clock() const;
  bool due_at_step(int64_t step) const;  // --checkpoint-every-steps
  // A checkpoint at `at` (none without --checkpoint-dir, or when one was taken at this step). An
  // earlier write that failed is thrown here, unless this is the process's `last` checkpoint (a
  // stop's, the run's end): then it is warned of and this one is written all the same, for
  // wait_for_writes to judge (the space may have come back, and it is the last chance to keep
  // the steps since the newest checkpoint).
  void save(const RunPosition& at, bool last = false);
  // Waits until rank 0's checkpoints are written; `doing` says what for in the error if one
  // could not be.
  void wait_for_writes(const std::string& doing);
  int64_t written() const { return written_; }
  double stall_seconds() const { return stall_; }

 private:
  void await_writes();


  dist::ProcessContext& ctx_;
  const TrainOptions& o_;
  std::unique_ptr<ckpt::CheckpointStore> store_;
  std::unique_ptr<ckpt::AsyncWriter> writer_;
  Engine& engine_;
  const ModelIdentity model_;
  int64_t written_ = 0;
  std::optional<RunPosition> last_saved_;
  double stall_ = 0;
  Clock::time_point last_time_ = Clock::now();
  OnWait on_wait_;
  uint64_t chunks_seen_ = 0;  // rank 0's writer's synced chunks at the last slice
};

}  // namespace hpc::train

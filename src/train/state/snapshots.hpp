// In-memory snapshots: the training state kept on every host, in memory that outlives the
// processes (a tmpfs, /dev/shm by default), so that a relaunch after a killed rank or a lost
// host continues from a few steps back instead of from the last checkpoint on shared storage.
//
// Data parallelism already replicates the state: every rank holds the same parameters and
// optimizer state. One process per host (its local rank 0) writes it, at step boundaries every
// --snapshot-every-steps, into DIR/<run id>/ckpt-<step>.hpck: the checkpoint format (checksummed
// sections), written as checkpoints are (a temporary name, then a rename) by a background
// thread, the step loop only copying. The state is rank 0's, bit for bit: the parameters,
// momentum, loss scale and batch-norm running statistics are the same on every rank (the
// engines average the statistics over the ranks after every step).
//
// The run's identity (a random id, CHECKPOINT_DIR/run-id) ties snapshots to the lineage of the
// checkpoint directory: a fresh start makes a new one, so snapshots of an earlier run there
// are never resumed. `--resume auto` takes the newest valid state among every host's snapshots
// and rank 0's checkpoints (find_resume_state); the lowest rank that holds it sends it to all.
// A failed snapshot is a warning, never the end of a run: the checkpoints on shared storage stay
// as they were, for when the whole cluster is lost.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "ckpt/checkpoint.hpp"
#include "ckpt/store.hpp"
#include "dist/process.hpp"
#include "nn/model.hpp"
#include "train/engine/engine.hpp"
#include "train/options/options.hpp"
#include "train/state/checkpointing.hpp"

namespace hpc::train {

// The run's identity: CHECKPOINT_DIR/run-id when --resume auto continues the directory, else a
// new one (a fresh start, --resume none or FILE), and the one the directory held before. Rank
// 0 reads it; every rank learns it. Empty without --checkpoint-dir (no snapshots then).
struct RunIdentity {
  std::string id, previous;  // previous: CHECKPOINT_DIR/run-id's, "" in a copy of the directory
  bool unbound = false;      // rank 0's: its run-id does not name its directory yet (rewritten)
};
RunIdentity run_identity(dist::ProcessContext& ctx, const TrainOptions& o);
// Rank 0 writes it into CHECKPOINT_DIR/run-id (atomically) when it is new.
void record_run_identity(const TrainOptions& o, const RunIdentity& r);

// Where this host keeps the run's snapshots: --snapshot-dir (default /dev/shm/hpctrain-UID)
// /<run id>. Empty when snapshots are off (--snapshot-every-steps 0, no --checkpoint-dir).
std::string snapshot_run_dir(const TrainOptions& o, const std::string& run_id);

// How long the snapshots of a run that failed or was killed are kept on a host for a relaunch to
// resume from (hpcrun relaunches in seconds, a requeued Slurm job in minutes): past this since
// their last write, the next run on the host, `hpctrain clean-snapshots` and the Slurm epilog
// (slurm/epilog.sh) remove them. Snapshots a running hpctrain uses are never removed.
inline constexpr double kSnapshotKeepSeconds = 3600;

// What clean_snapshots() removes of the run directories in a snapshot directory.
struct SnapshotCleaning {
  double older_than = kSnapshotKeepSeconds;  // untouched for longer than this (seconds)
  bool all = false;                          // every one not in use, whatever its age
  std::string run_id;                        // only this run's (not in use), whatever its age
  std::string except;                        // never this run's (the caller's own)
  // Also, whatever their age, those of runs that have ended for good, as their checkpoint
  // directory tells (finished, or gone on to another run): on a host a requeued job left, the
  // next job's epilog frees them, not one an hour on.
  bool ended_runs = false;
};
struct CleanedSnapshots {
  int removed = 0, kept_in_use = 0, kept_young = 0;
  uint64_t freed_bytes = 0, kept_bytes = 0;
};
// Removes the run directories (named by a run id) in `parent` that `what` asks for, except those
// a running hpctrain holds (its in-use lock), each with one info line naming it; other files stay.
CleanedSnapshots clean_snapshots(const std::string& parent, const SnapshotCleaning& what);
// The default --snapshot-dir: /dev/shm/hpctrain-UID.
std::string default_snapshot_parent();
// `hpctrain clean-snapshots [--snapshot-dir DIR] [--older-than DURATION | --all | --run-id ID]`:
// on every host of the job (its local rank 0), the user's snapshots that no relaunch needs.
int run_clean_snapshots(int argc, const char* const* argv, dist::ProcessContext& ctx);
// `hpctrain persist-snapshot --checkpoint-dir DIR [--snapshot-dir S] [--checkpoint-lock-wait D]`:
// the newest valid snapshot of DIR's run on any host of the job (each host's local rank 0 offers
// its own), where it is newer than DIR's newest checkpoint, written into DIR as the checkpoint
// of its step, under DIR's lock (a run training there now is refused, exit 2). hpcrun runs it
// as a job ends with steps that only host memory holds (launch/supervisor.cpp).
int run_persist_snapshot(int argc, const char* const* argv, dist::ProcessContext& ctx);


// Where a resumed run's state came from.
enum class StateSource { None, Checkpoint, Snapshot };
const char* source_name(StateSource s);  // "none", "checkpoint", "snapshot"

struct FoundState {
  std::optional<ckpt::Checkpoint> state;  // the same bytes on every rank; nullopt: a fresh start
  std::string path;                       // where it came from (on the rank that read it)
  StateSource source = StateSource::None;
};

// The state --resume asks for: find_resume's checkpoint; under --resume auto with snapshots
// (run_dir not empty), the newest of it and every host's newest valid snapshot. Snapshots that
// are damaged, older than the newest checkpoint, of another run or of options the run cannot
// resume are skipped, each with one warning naming it. Collective.
FoundState find_resume_state(dist::ProcessContext& ctx, const TrainOptions& o, const nn::Model<float>& model,
                             int64_t training_samples, const std::string& run_dir, const std::string& run_id);

// The step loop's snapshots, on every rank (the writing is local rank 0's).
class Snapshotter {
 public:
  // Collective: decides whether snapshots are taken (run_dir empty: off). They are switched off
  // with one warning when the run's snapshots would not fit --snapshot-max-memory or the free
  // space of run_dir's file system on some host, or run_dir cannot be made there. Removes the
  // snapshots of earlier runs on this host older than a day, and those of `previous_run_id`
  // (the lineage a fresh start replaced).
  Snapshotter(dist::ProcessContext& ctx, const TrainOptions& o, Engine& engine, ModelIdentity model,
              std::string run_dir, std::string run_id, const std::string& previous_run_id);
  ~Snapshotter();
  bool enabled() const { return enabled_; }
  // Rank 0's answer (StepAgreement spreads it): whether a snapshot is due after `step`: at every
  // multiple of --snapshot-every-steps (under auto, of the spacing rank 0 chose last).
  bool due(int64_t step) const;
  // A snapshot of the state at `at` (collective; does nothing when off or when one was taken at
  // this step). The step loop pays the copy; the write is in the background.
  void take(const RunPosition& at);
  // take(at), then waits until every host has written it: whether all did (collective).
  bool take_and_wait(const RunPosition& at);
  // Where the run starts (the step of the state it resumed, which holds no new snapshot).
  void begins_at(int64_t step) { last_ = step; }
  // Until this host's snapshot in flight is written (the tests' kill hook).
  void wait();
  // The run has finished: its snapshots go (on every host, also where they were off).
  void remove_all();
  double stall_seconds() const { return stall_; }
  int64_t taken() const { return taken_; }

 private:
  bool writes() const { return writer_ != nullptr; }
  void check_budget(size_t state_bytes);
  void remove_leftovers(const std::string& previous_run_id);
  void hold_in_use();
  // Writes the run directory's record of the checkpoint directory (for ended_runs).
  void record_checkpoint_dir();
  // Whether the write in flight (if any) succeeded; a failure is a warning.
  bool settle();

  dist::ProcessContext& ctx_;
  const TrainOptions& o_;
  Engine& engine_;
  const ModelIdentity model_;
  const std::string run_dir_, run_id_;
  bool enabled_ = false;
  std::unique_ptr<ckpt::CheckpointStore> store_;
  std::unique_ptr<ckpt::AsyncWriter> writer_;
  int in_use_fd_ = -1;  // the run directory's in-use lock (shared), held while the run lives
  int64_t last_ = -1, taken_ = 0;
  // writer_'s count of writes completed when one failed (said once, until a write completes again)
  std::optional<int64_t> failed_at_;
  int64_t every_ = 0;  // steps between snapshots (rank 0's, adapted under auto)
  double stall_ = 0;
  std::chrono::steady_clock::time_point last_time_ = std::chrono::steady_clock::now();
};

}  // namespace hpc::train

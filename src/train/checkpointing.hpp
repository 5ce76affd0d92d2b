// The training loop's side of checkpoints: what goes into one (src/ckpt holds the format and
// the store), finding the one to resume from, and checking that it fits this run.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "ckpt/checkpoint.hpp"
#include "data/dataset.hpp"
#include "dist/process.hpp"
#include "nn/model.hpp"
#include "optim/loss_scaler.hpp"
#include "optim/sgd.hpp"
#include "train/options.hpp"

namespace hpc::train {

// Where a run stands: the next step to run, as a position every world size understands
// (global steps of the global batch), and the samples consumed so far.
struct RunPosition {
  int64_t step = 0;           // global steps done
  int64_t epoch = 0;          // epoch of the next step
  int64_t step_in_epoch = 0;  // index of the next step within that epoch
  int64_t global_batch = 0;
  double samples_seen = 0;    // what the schedules are functions of
  // fp16 runs: the dynamic loss scale and its counters (checkpoint keys loss_scale,
  // loss_scale_good_steps, skipped_steps), so a resumed run scales as the first would have.
  std::optional<optim::LossScalerState> scaler;

  // Where a run stands after global step `step`, whose index in `epoch` was `index`: at the
  // end of the epoch (steps_per_epoch steps) the next step opens the next epoch.
  static RunPosition after_step(int64_t step, int64_t epoch, int64_t index, int64_t steps_per_epoch,
                                int64_t global_batch, double samples_seen) {
    if (index + 1 < steps_per_epoch) return {step, epoch, index + 1, global_batch, samples_seen, {}};
    return {step, epoch + 1, 0, global_batch, samples_seen, {}};
  }
};

// A copy of the state (rank 0's) at `at`, with the options and model it belongs to, into c
// (whose buffers are reused: see ckpt::AsyncWriter::recycled).
void fill_checkpoint(ckpt::Checkpoint& c, const TrainOptions& o, const nn::Model<float>& model,
                     const optim::Sgd<float>& sgd, int world, const RunPosition& at);
ckpt::Checkpoint make_checkpoint(const TrainOptions& o, const nn::Model<float>& model, const optim::Sgd<float>& sgd,
                                 int world, const RunPosition& at);

// The checkpoint --resume asks for, read and verified by rank 0 and handed to every rank, or
// nullopt for a fresh start. Sets *path to where it came from.
std::optional<ckpt::Checkpoint> find_resume(const TrainOptions& o, dist::ProcessContext& ctx, std::string* path);

// What `read` finds on rank 0 (a checkpoint and its path, or nothing), on every rank: rank 0
// reads and verifies, the others receive its verdict (an error in `read` is every rank's
// error) and the bytes.
using CheckpointReader = std::function<std::optional<std::pair<std::string, ckpt::Checkpoint>>()>;
std::optional<ckpt::Checkpoint> read_on_rank0(dist::ProcessContext& ctx, const CheckpointReader& read,
                                              std::string* path);

// The newest valid checkpoint when `path` is a directory, else that file (usage error when
// there is none or it is damaged).
std::pair<std::string, ckpt::Checkpoint> load_checkpoint_or_latest(const std::string& path);

// The model a checkpoint holds, for a dataset of this sample shape and number of classes.
nn::ModelSpec model_spec_of(const ckpt::Checkpoint& c, const data::Dataset& ds);

// Usage error unless the checkpoint's parameters fit `model` (same name and layout).
void check_model(const ckpt::Checkpoint& c, const nn::Model<float>& model);

// The position a checkpoint resumes at. Throws a usage error naming the first difference when
// it belongs to another model or to options that change what is computed.
RunPosition check_resumable(const ckpt::Checkpoint& c, const TrainOptions& o, const nn::Model<float>& model);

// Loads parameters, optimizer state and batch-norm statistics.
void apply_checkpoint(const ckpt::Checkpoint& c, nn::Model<float>& model, optim::Sgd<float>& sgd);
// Parameters and batch-norm statistics only (inference).
void apply_model_state(const ckpt::Checkpoint& c, nn::Model<float>& model);

}  // namespace hpc::train

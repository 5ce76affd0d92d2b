// The training loop's side of checkpoints: what goes into one (src/ckpt holds the format and
// the store), finding the one to resume from, and checking that it fits this run.
#pragma once

#include <optional>
#include <string>

#include "ckpt/checkpoint.hpp"
#include "dist/process.hpp"
#include "nn/model.hpp"
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

// The position a checkpoint resumes at. Throws a usage error naming the first difference when
// it belongs to another model or to options that change what is computed.
RunPosition check_resumable(const ckpt::Checkpoint& c, const TrainOptions& o, const nn::Model<float>& model);

// Loads parameters, optimizer state and batch-norm statistics.
void apply_checkpoint(const ckpt::Checkpoint& c, nn::Model<float>& model, optim::Sgd<float>& sgd);

}  // namespace hpc::train

// The training loop: data in, steps, evaluation each epoch, metrics and progress out.
#pragma once

#include <functional>
#include <string>

#include "data/dataset.hpp"
#include "data/loader.hpp"
#include "dist/communicator.hpp"
#include "dist/process.hpp"
#include "nn/model.hpp"
#include "train/options/options.hpp"

namespace hpc::train {

struct EvalResult {
  double loss = 0, accuracy = 0;
  int64_t samples = 0;
};

struct TrainResult {
  int64_t steps = 0;
  double test_accuracy = 0, test_loss = 0;
  double train_seconds = 0, images_per_second = 0;
  std::string param_checksum, state_checksum;  // of the final state (train/state/checkpointing.hpp)
  int exit_code = 0;  // kExitCheckpointed (75) when stopped by a signal after a checkpoint
};

// Loss and accuracy of the model (in eval mode) on a whole dataset. With a communicator,
// each rank evaluates a contiguous share of the dataset's batches of batch_size and the batches'
// sums are added up in order on every rank: the same bits on any number of ranks. on_batch is
// called after every batch (the step watchdog's progress).
// decode_threads: how many threads decode a batch of packed images (shards).
EvalResult evaluate(nn::Model<float>& model, const data::Dataset& ds, const data::Normalization& norm,
                    int64_t batch_size, dist::Communicator* comm = nullptr,
                    const std::function<void()>& on_batch = {}, int decode_threads = 1);
// The same with any per-batch evaluation: run(batch, sums) adds the batch's loss sum and
// correct count to sums[0] and sums[1] (an Engine's eval_batch). bytes: batches of bytes
// for a GPU to normalise (data::BatchAssembler).
EvalResult evaluate(const std::function<void(const data::Batch&, double*)>& run, const data::Dataset& ds,
                    const data::Normalization& norm, int64_t batch_size, dist::Communicator* comm = nullptr,
                    const std::function<void()>& on_batch = {}, int decode_threads = 1, bool bytes = false);

// Runs a whole training job as the options say, as one rank of ctx's world. Throws
// hpc::Error on bad input (a dist::CollectiveError when every rank throws it).
TrainResult run_training(const TrainOptions& options, dist::ProcessContext& ctx);

}  // namespace hpc::train

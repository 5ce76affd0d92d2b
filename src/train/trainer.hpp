// The training loop: data in, steps, evaluation each epoch, metrics and progress out.
#pragma once

#include <string>

#include "data/dataset.hpp"
#include "nn/model.hpp"
#include "train/options.hpp"

namespace hpc::train {

struct EvalResult {
  double loss = 0, accuracy = 0;
  int64_t samples = 0;
};

struct TrainResult {
  int64_t steps = 0;
  double test_accuracy = 0, test_loss = 0;
  double train_seconds = 0, images_per_second = 0;
  std::string param_checksum;
};

// Loss and accuracy of the model (in eval mode) on a whole dataset, in order.
EvalResult evaluate(nn::Model<float>& model, const data::Dataset& ds, const data::Normalization& norm,
                    int64_t batch_size);

// Runs a whole training job as the options say. Throws hpc::Error on bad input.
TrainResult run_training(const TrainOptions& options);

}  // namespace hpc::train

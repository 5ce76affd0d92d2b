// GPU inference in a build without GPU training: asking for it is a usage error naming what the
// build lacks (as train/engine/gpu_engine_none.cpp for training).
#include "core/error.hpp"
#include "train/engine/engine.hpp"
#include "train/engine/inference.hpp"

namespace hpc::train {

std::unique_ptr<Inference> make_gpu_inference(nn::Model<float>&, int) {
  std::string why;
  gpu_training_available(&why);
  usage_error("--device cuda: ", why);
}

}  // namespace hpc::train

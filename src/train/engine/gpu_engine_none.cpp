// GPU training in a build without the CUDA toolkit, cuDNN or NCCL: never available, and
// asking for it is a usage error naming what the build lacks (DESIGN.md principle 2: the
// backend is chosen by which file CMake compiles).
#include "core/device.hpp"
#include "core/error.hpp"
#include "train/engine/engine.hpp"

namespace hpc::train {

bool gpu_training_available(std::string* why) {
  if (why)
    *why = std::string("this hpctrain was built without GPU training (it needs the CUDA toolkit with cuDNN and "
                       "NCCL at build time; ") +
           device::describe() + ")";
  return false;
}

std::string gpu_kernels(int) { return ""; }

std::unique_ptr<Engine> make_gpu_engine(std::unique_ptr<nn::Model<float>>, std::unique_ptr<optim::Sgd<float>>,
                                        dist::ProcessContext&, const EngineSpec&) {
  std::string why;
  gpu_training_available(&why);
  usage_error("--device cuda: ", why);
}

std::unique_ptr<data::BatchDecoder> make_gpu_decoder(int) {
  std::string why;
  gpu_training_available(&why);
  usage_error("--jpeg-decode gpu: ", why);
}

}  // namespace hpc::train

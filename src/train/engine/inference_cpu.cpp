#include <cstring>

#include "core/error.hpp"
#include "train/engine/inference.hpp"

namespace hpc::train {
namespace {

class CpuInference final : public Inference {
 public:
  CpuInference(nn::Model<float>& model, int threads) : model_(model), threads_(threads) {}

  void logits(const Tensor& images, std::vector<float>& out) override {
    const Tensor& y = model_.forward(images, false);
    out.resize(static_cast<size_t>(y.numel()));
    std::memcpy(out.data(), y.data<float>(), out.size() * sizeof(float));
  }

  std::string describe() const override { return detail::concat("the CPU, ", threads_, " thread(s)"); }

 private:
  nn::Model<float>& model_;
  int threads_;
};

}  // namespace

std::unique_ptr<Inference> make_cpu_inference(nn::Model<float>& model, int threads) {
  return std::make_unique<CpuInference>(model, threads);
}

}  // namespace hpc::train

#include "core/error.hpp"
#include "train/engine/engine.hpp"  // for_each_forward_chunk
#include "train/engine/inference.hpp"

namespace hpc::train {
namespace {

class CpuInference final : public Inference {
 public:
  CpuInference(nn::Model<float>& model, int threads) : model_(model), threads_(threads) {}

  void logits(const Tensor& images, std::vector<float>& out) override {
    out.clear();
    for_each_forward_chunk(images, [&](const Tensor& chunk, int64_t, int64_t) {
      const Tensor& y = model_.forward(chunk, false);
      out.insert(out.end(), y.data<float>(), y.data<float>() + y.numel());
    });
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

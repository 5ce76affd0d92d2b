// GPU inference: the host model mirrored on this rank's GPU by the GpuNetwork the GPU engine
// trains and evaluates with, in fp32 (IEEE float, no tensor-core rounding), deterministic.
// Everything runs on the context's compute stream; the copy of the logits back is waited for.
#include <cuda_runtime_api.h>

#include "core/device.hpp"
#include "nn/cuda/network.hpp"
#include "train/engine/inference.hpp"

namespace hpc::train {
namespace {

nn::cuda::GpuSettings fp32() {
  nn::cuda::GpuSettings s;
  s.math = nn::cuda::Math::Fp32;
  s.deterministic = true;
  return s;
}

class GpuInference final : public Inference {
 public:
  GpuInference(nn::Model<float>& model, int local_rank)
      : gpu_(device::select_gpu(local_rank)), context_(fp32()), net_(context_, model) {
    net_.upload(model.params());
  }

  void logits(const Tensor& images, std::vector<float>& out) override {
    nn::cuda::ensure(x_, images.shape());
    CUDA_CHECK(cudaMemcpyAsync(x_.raw(), images.raw(), images.bytes(), cudaMemcpyHostToDevice, context_.stream()));
    const Tensor& y = net_.forward(x_, false);
    out.resize(static_cast<size_t>(y.numel()));
    CUDA_CHECK(cudaMemcpyAsync(out.data(), y.raw(), y.bytes(), cudaMemcpyDeviceToHost, context_.stream()));
    context_.synchronize();
  }

  std::string describe() const override {
    cudaDeviceProp p{};
    CUDA_CHECK(cudaGetDeviceProperties(&p, gpu_));
    return detail::concat("GPU ", gpu_, " (", p.name, "), fp32");
  }

 private:
  int gpu_;
  nn::cuda::GpuContext context_;
  nn::cuda::GpuNetwork net_;
  Tensor x_;  // the batch on the device
};

}  // namespace

std::unique_ptr<Inference> make_gpu_inference(nn::Model<float>& model, int local_rank) {
  return std::make_unique<GpuInference>(model, local_rank);
}

}  // namespace hpc::train

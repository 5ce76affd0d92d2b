#include "nn/cuda/network.hpp"

#include "core/device.hpp"
#include "kernels/kernels.hpp"

namespace hpc::nn::cuda {
namespace {

void copy_tensor(Tensor& dst, const Tensor& src, device::Copy direction) {
  HPC_CHECK(dst.bytes() == src.bytes(), "arena copy of ", src.bytes(), " bytes into ", dst.bytes());
  device::copy(dst.raw(), src.raw(), src.bytes(), direction);
}

}  // namespace

GpuNetwork::GpuNetwork(GpuContext& ctx, const Model<float>& host)
    : ctx_(ctx), host_(host), arenas_(host.params()), net_(mirror(ctx, arenas_, host.net())) {
  const auto& first = host.net().first_slots();
  for (size_t i = 0; i + 1 < first.size(); ++i)
    group_offset_.push_back(first[i + 1] > first[i] ? host.params().slots()[first[i]].offset : -1);
  // Room for a double and an int, 8-byte aligned.
  sums_ = Tensor(Shape{4}, DType::F32, DeviceKind::CUDA);
}

void GpuNetwork::upload(const ParamStore<float>& host) {
  copy_tensor(arenas_.values(), host.values(), device::Copy::HostToDevice);
  copy_tensor(arenas_.buffers(), host.buffers(), device::Copy::HostToDevice);
}

void GpuNetwork::download(ParamStore<float>& host) {
  copy_tensor(host.values(), arenas_.values(), device::Copy::DeviceToHost);
  copy_tensor(host.buffers(), arenas_.buffers(), device::Copy::DeviceToHost);
}

const Tensor& GpuNetwork::forward(const Tensor& x, bool train) {
  const DType act = ctx_.act();
  if (act == DType::F32) return net_->forward(x, train);
  // The weights' 16-bit copies, all in one launch, from the values as they are now (see
  // DeviceArenas): every forward pass, so nothing that changes the values has to remember it.
  arenas_.refresh_low(act, ctx_.stream());
  ensure(x_low_, x.shape(), act);
  kernels::convert(DType::F32, x.raw(), act, x_low_.raw(), x.numel(), 1.0f, nullptr, ctx_.stream());
  const Tensor& y = net_->forward(x_low_, train);
  ensure(logits_, y.shape());
  kernels::convert(act, y.raw(), DType::F32, logits_.raw(), y.numel(), 1.0f, nullptr, ctx_.stream());
  return logits_;
}

void GpuNetwork::loss(const Tensor& logits, const int32_t* labels) {
  const int64_t n = logits.shape()[0], k = logits.shape()[1];
  ensure(prob_, logits.shape());
  ensure(dlogits_, logits.shape());
  ensure(row_loss_, Shape{n});
  rows_ = n;
  auto* sum = static_cast<double*>(sums_.raw());
  int* correct = reinterpret_cast<int*>(sum + 1);
  kernels::softmax_xent(logits.data<float>(), labels, n, k, static_cast<float>(host_.spec().label_smoothing),
                        prob_.data<float>(), dlogits_.data<float>(), row_loss_.data<float>(), ctx_.stream());
  kernels::sum_deterministic(row_loss_.data<float>(), n, sum, ctx_.stream());
  CUDA_CHECK(cudaMemsetAsync(correct, 0, sizeof(int), ctx_.stream()));
  kernels::count_correct(prob_.data<float>(), labels, n, k, correct, ctx_.stream());
}

void GpuNetwork::backward(const std::function<void(int64_t)>& grads_ready, bool land) {
  const Tensor* d = &dlogits_;
  if (ctx_.act() != DType::F32) {  // the gradient of the loss times the loss scale, in 16 bits
    ensure(dlogits_low_, dlogits_.shape(), ctx_.act());
    kernels::convert(DType::F32, dlogits_.raw(), ctx_.act(), dlogits_low_.raw(), dlogits_.numel(), ctx_.loss_scale(),
                     nullptr, ctx_.stream());
    d = &dlogits_low_;
  }
  net_->backward_with(*d, false, [&](size_t i) {
    if (group_offset_[i] >= 0) grads_ready(group_offset_[i]);
  });
  if (land) land_grads();
}

GpuNetwork::LossSums GpuNetwork::sums() {
  struct {
    double loss;
    int correct;
  } host{};  // the device layout loss() writes: a double, then an int
  static_assert(sizeof host == 2 * sizeof(double));
  CUDA_CHECK(cudaMemcpyAsync(&host, sums_.raw(), sizeof host, cudaMemcpyDeviceToHost, ctx_.stream()));
  ctx_.synchronize();
  return {host.loss, host.correct};
}

}  // namespace hpc::nn::cuda

#include "nn/cuda/network.hpp"

#include "core/device.hpp"
#include "kernels/kernels.hpp"

namespace hpc::nn::cuda {
namespace {

std::unique_ptr<GpuSequential> mirror(GpuContext& ctx, DeviceArenas& arenas, const Sequential<float>& host);

// One GPU layer per CPU layer, as a visitor of every kind of layer (nn/layer.hpp): a kind without
// a GPU form leaves this class abstract, and the build fails; never a silent CPU fallback
// (DESIGN.md principle 3). Each visit adds the layer's mirror to seq, the layer's input and output
// shapes in in and out.
class Mirror final : public LayerVisitor<float> {
 public:
  Mirror(GpuContext& ctx, DeviceArenas& arenas, GpuSequential& seq) : ctx_(ctx), arenas_(arenas), seq_(seq) {}
  void at(const Shape& in, const Shape& out) { in_ = &in, out_ = &out; }

  void visit(const Conv2d<float>& c) override {
    const ConvSpec& s = c.spec();
    seq_.add(std::make_unique<ConvGpu>(ctx_, arenas_, Geometry::of(*in_), Geometry::of(*out_), s.kernel, s.stride,
                                       s.padding, c.weight_slot(), c.bias_slot()));
  }
  void visit(const BatchNorm<float>& b) override {
    seq_.add(std::make_unique<BatchNormGpu>(ctx_, arenas_, Geometry::of(*in_), b.fused_relu(), b.fused_pool().kernel,
                                            b.fused_pool().stride, b.momentum(), b.eps(), b.gamma_slot(),
                                            b.beta_slot(), b.running_mean_slot(), b.running_var_slot()));
  }
  void visit(const ReLU<float>&) override { seq_.add(std::make_unique<ReluGpu>(ctx_)); }
  void visit(const MaxPool2d<float>& p) override {
    seq_.add(std::make_unique<PoolGpu>(ctx_, PoolGpu::Kind::Max, Geometry::of(*in_), p.kernel(), p.stride()));
  }
  void visit(const GlobalAvgPool<float>&) override {
    seq_.add(std::make_unique<PoolGpu>(ctx_, PoolGpu::Kind::GlobalAverage, Geometry::of(*in_), 0, 0));
  }
  void visit(const Flatten<float>&) override { seq_.add(std::make_unique<FlattenGpu>()); }
  void visit(const Linear<float>& f) override {
    seq_.add(std::make_unique<LinearGpu>(ctx_, arenas_, in_->numel(), out_->numel(), f.weight_slot(), f.bias_slot()));
  }
  void visit(const Residual<float>& r) override {
    seq_.add(std::make_unique<ResidualGpu>(ctx_, mirror(ctx_, arenas_, r.main()), mirror(ctx_, arenas_, r.shortcut())));
  }
  void visit(const Sequential<float>& s) override { seq_.add(mirror(ctx_, arenas_, s)); }

 private:
  GpuContext& ctx_;
  DeviceArenas& arenas_;
  GpuSequential& seq_;
  const Shape *in_ = nullptr, *out_ = nullptr;
};

// The GPU layers of `host`, recursively.
std::unique_ptr<GpuSequential> mirror(GpuContext& ctx, DeviceArenas& arenas, const Sequential<float>& host) {
  auto seq = std::make_unique<GpuSequential>();
  Mirror m(ctx, arenas, *seq);
  const auto& shapes = host.shapes();
  for (size_t i = 0; i < host.layers().size(); ++i) {
    m.at(shapes[i], shapes[i + 1]);
    host.layers()[i]->accept(m);
  }
  return seq;
}

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

void GpuNetwork::backward(const std::function<void(int64_t)>& grads_ready) {
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

// The GPU layers: each mirrors one CPU layer of nn/layer.hpp (the reference it is tested
// against, DESIGN.md principle 3) with the same contract: forward returns the layer's own
// output buffer; backward OVERWRITES the parameter gradients and returns dx when need_dx.
// Tensors are device tensors, NHWC as on the CPU; parameters are views into device arenas with
// the host ParamStore's layout (same offsets), so checkpoints, the optimizer's decay table and
// the gradient buckets are the CPU's.
//
// Convolution, pooling and batch norm in eval mode go through cuDNN, matrix products through
// cuBLAS, the rest (batch norm in training too) through kernels/ — all on the context's
// compute stream.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/arena.hpp"
#include "kernels/kernels.hpp"
#include "nn/cuda/context.hpp"

namespace hpc::nn {
template <class T>
class Sequential;
}  // namespace hpc::nn

namespace hpc::nn::cuda {

// Device arenas laid out as a host ParamStore: values, gradients and buffers at the host
// slots' offsets.
//
// Mixed precision: the products read 16-bit copies of the fp32 values (as autocast's weight
// casts). One copy of the whole value arena, same offsets, made by ONE conversion launch
// (refresh_low) instead of one per tensor: GpuNetwork::forward refreshes it before every
// forward pass, so it holds the values that pass reads whatever changed them since (the SGD
// update, an upload, a restore or broadcast), and a captured step contains the conversion.
// value_low(slot) is valid until the next refresh_low. Slots are 64-byte aligned in fp32, so
// 32-byte aligned in the copy: more than the 16 bytes cuDNN's and cuBLAS's tensor-core paths need.
//
// The other way, a 16-bit gradient arena of the same layout: cuDNN writes a convolution's weight
// gradient in the filter's type, at grad_low(slot); the layer then defers it (defer_grad), and
// land_grads converts every deferred slot into the fp32 arena, the loss scale divided out, in one
// launch (kernels::convert_spans) instead of one a layer: GpuNetwork::backward lands them at its
// end, and a bucket's all-reduce lands them before it starts (the engine's NcclBuckets). Until
// then a deferred slot's fp32 gradient is not yet written.
class DeviceArenas {
 public:
  explicit DeviceArenas(const ParamStore<float>& layout);
  float* value(int slot) const { return at(values_, layout_->slots().at(slot).offset); }
  void refresh_low(DType t, cudaStream_t stream);
  const void* value_low(int slot) const;
  const Tensor& values_low() const { return values_low_; }
  float* grad(int slot) const { return at(grads_, layout_->slots().at(slot).offset); }
  void* grad_low(int slot, DType t);
  void defer_grad(int slot);
  void land_grads(float factor, cudaStream_t stream);
  // The deferred slots forgotten, not landed: those of a captured step whose capture failed.
  void forget_deferred() { deferred_.clear(); }
  bool has_deferred() const { return !deferred_.empty(); }
  float* buffer(int slot) const { return at(buffers_, layout_->buffer_slots().at(slot).offset); }
  Tensor& values() { return values_; }
  Tensor& grads() { return grads_; }
  Tensor& buffers() { return buffers_; }

 private:
  static float* at(const Tensor& t, int64_t offset) { return t.data<float>() + offset; }
  const ParamStore<float>* layout_;
  Tensor values_, grads_, buffers_;
  Tensor values_low_;  // mixed precision: the 16-bit copy of values_ (refresh_low)
  Tensor grads_low_;   // mixed precision: 16-bit weight gradients (grad_low), same offsets as grads_
  std::vector<kernels::Span> deferred_;  // written at grads_low_, not yet landed in grads_
};

class GpuLayer {
 public:
  virtual ~GpuLayer() = default;
  virtual const Tensor& forward(const Tensor& x, bool train) = 0;
  virtual const Tensor& backward(const Tensor& dy, bool need_dx) = 0;
};
using GpuLayerPtr = std::unique_ptr<GpuLayer>;

class GpuSequential final : public GpuLayer {
 public:
  void add(GpuLayerPtr l) { layers_.push_back(std::move(l)); }
  bool empty() const { return layers_.empty(); }
  size_t size() const { return layers_.size(); }
  GpuLayer* first() const { return layers_.empty() ? nullptr : layers_.front().get(); }
  GpuLayer* last() const { return layers_.empty() ? nullptr : layers_.back().get(); }
  const Tensor& forward(const Tensor& x, bool train) override;
  const Tensor& backward(const Tensor& dy, bool need_dx) override;
  // backward, calling after_layer(i) once layer i's backward is enqueued.
  const Tensor& backward_with(const Tensor& dy, bool need_dx, const std::function<void(size_t)>& after_layer);

 private:
  std::vector<GpuLayerPtr> layers_;
};

// Per-sample geometry of an NHWC activation; a feature vector {F} is 1 x 1 x F.
struct Geometry {
  int64_t h = 1, w = 1, c = 1;
  static Geometry of(const Shape& per_sample);
  int64_t size() const { return h * w * c; }
};

class ConvGpu final : public GpuLayer {
 public:
  // weight: Cout x k x k x Cin (KRSC, cuDNN's NHWC filter layout); bias may be -1.
  ConvGpu(GpuContext& ctx, DeviceArenas& arenas, Geometry in, Geometry out, int64_t kernel, int64_t stride,
          int64_t padding, int weight_slot, int bias_slot);
  const Tensor& forward(const Tensor& x, bool train) override;
  const Tensor& backward(const Tensor& dy, bool need_dx) override;
  // Until reset (nullptr): the backward writes dx into *target instead of its own buffer, or,
  // when accumulate, adds it to what *target holds (a residual block's sum of branches).
  void set_dx_target(Tensor* target, bool accumulate);

 private:
  struct Plan {  // the algorithms for one batch size, chosen once
    bool have_bwd_data = false;  // chosen at the first backward that needs dx (never for the first layer)
    cudnnConvolutionFwdAlgo_t fwd{};
    cudnnConvolutionBwdDataAlgo_t bwd_data{};
    cudnnConvolutionBwdFilterAlgo_t bwd_filter{};
    cudnnMathType_t fwd_math{}, bwd_data_math{}, bwd_filter_math{};
    size_t fwd_bytes = 0, bwd_data_bytes = 0, bwd_filter_bytes = 0;
  };
  Plan& plan(int64_t n);
  void choose_backward_data(Plan& p);

  GpuContext& ctx_;
  DeviceArenas& arenas_;
  Geometry in_, out_;
  int weight_, bias_;
  FilterDesc filter_;
  ConvDesc conv_fwd_, conv_bwd_data_, conv_bwd_filter_;
  TensorDesc x_desc_, y_desc_, bias_desc_;
  int64_t described_n_ = -1;
  std::map<int64_t, Plan> plans_;
  const void* weight_used_ = nullptr;  // the fp32 weight, or its 16-bit copy (DeviceArenas::value_low)
  Tensor* dx_target_ = nullptr;
  bool accumulate_dx_ = false;
  Tensor x_, y_, dx_;
  Tensor sums_work_;  // the bias gradient's scratch (kernels::channel_sums_work_bytes)
};

// BatchNorm [+ ReLU] [+ max pool]: the fusions of the CPU layer, as three cuDNN/kernel passes.
class BatchNormGpu final : public GpuLayer {
 public:
  BatchNormGpu(GpuContext& ctx, DeviceArenas& arenas, Geometry in, bool relu, int64_t pool_kernel,
               int64_t pool_stride, double momentum, double eps, int gamma, int beta, int running_mean,
               int running_var);
  const Tensor& forward(const Tensor& x, bool train) override;
  const Tensor& backward(const Tensor& dy, bool need_dx) override;
  // A residual block's join, fused: while residual is set, the forward returns
  // relu(bn(x) + *residual). Only for a batch norm without its own ReLU and pool.
  bool joinable() const { return !relu_ && pool_kernel_ == 0; }
  void join(const Tensor* residual);

 private:
  GpuContext& ctx_;
  DeviceArenas& arenas_;
  Geometry in_, pooled_;
  bool relu_;
  int64_t pool_kernel_, pool_stride_;
  double momentum_, eps_;
  int gamma_, beta_, running_mean_, running_var_;
  PoolDesc pool_;
  TensorDesc x_desc_, pooled_desc_, stats_desc_;
  int64_t described_n_ = -1;
  DType io_;  // the type it computes in: GpuContext::norm_type()
  const Tensor* join_ = nullptr;
  Tensor x_, y_, pooled_y_, save_mean_, save_invstd_, dnorm_, dx_;
  Tensor work_;  // the training kernels' scratch (kernels::batch_norm_work_bytes)
  Tensor x_wide_, dy_wide_, y_low_, dx_low_;  // when io_ is not the activations' type
};

class ReluGpu final : public GpuLayer {
 public:
  explicit ReluGpu(GpuContext& ctx) : ctx_(ctx) {}
  const Tensor& forward(const Tensor& x, bool train) override;
  const Tensor& backward(const Tensor& dy, bool need_dx) override;

 private:
  GpuContext& ctx_;
  Tensor y_, dx_;
};

// Max pooling (kernel x kernel, stride, padding cells that never win) or global average
// pooling (the whole image).
class PoolGpu final : public GpuLayer {
 public:
  enum class Kind { Max, GlobalAverage };
  PoolGpu(GpuContext& ctx, Kind kind, Geometry in, int64_t kernel, int64_t stride, int64_t padding);
  const Tensor& forward(const Tensor& x, bool train) override;
  const Tensor& backward(const Tensor& dy, bool need_dx) override;

 private:
  GpuContext& ctx_;
  Kind kind_;
  Geometry in_, out_;
  int64_t kernel_, stride_, padding_;  // of a max pool (Kind::Max)
  PoolDesc pool_;
  TensorDesc x_desc_, y_desc_;
  int64_t described_n_ = -1;
  DType io_;  // as BatchNormGpu's
  Tensor x_, y_, dx_, x_wide_, dy_wide_, y_low_, dx_low_;
};

class FlattenGpu final : public GpuLayer {
 public:
  const Tensor& forward(const Tensor& x, bool train) override;
  const Tensor& backward(const Tensor& dy, bool need_dx) override;

 private:
  Shape in_;
  Tensor y_, dx_;
};

class LinearGpu final : public GpuLayer {
 public:
  LinearGpu(GpuContext& ctx, DeviceArenas& arenas, int64_t in, int64_t out, int weight_slot, int bias_slot);
  const Tensor& forward(const Tensor& x, bool train) override;
  const Tensor& backward(const Tensor& dy, bool need_dx) override;

 private:
  const Tensor& forward_low(const Tensor& x, int o, int i, int m);
  const Tensor& backward_low(const Tensor& dy, bool need_dx, int o, int i, int m);

  GpuContext& ctx_;
  DeviceArenas& arenas_;
  int64_t in_, out_;
  int weight_, bias_;
  const void* weight_used_ = nullptr;  // the weight's 16-bit copy (mixed precision: DeviceArenas::value_low)
  Tensor x_, y_, dx_;
  Tensor sums_work_;  // the 16-bit bias gradient's scratch (kernels::channel_sums_work_bytes)
};

// relu(main(x) + shortcut(x)); an empty shortcut is the identity. Where the branches allow
// it, the join and its ReLU run inside the main branch's last batch norm, and the branches'
// input gradients are summed by their first convolutions: no pass of their own.
class ResidualGpu final : public GpuLayer {
 public:
  ResidualGpu(GpuContext& ctx, std::unique_ptr<GpuSequential> main, std::unique_ptr<GpuSequential> shortcut);
  const Tensor& forward(const Tensor& x, bool train) override;
  const Tensor& backward(const Tensor& dy, bool need_dx) override;

 private:
  GpuContext& ctx_;
  std::unique_ptr<GpuSequential> main_, shortcut_;
  BatchNormGpu* join_ = nullptr;
  ConvGpu *main_conv_ = nullptr, *short_conv_ = nullptr;
  const Tensor* out_ = nullptr;  // the block's output: y_, or the joining batch norm's
  Tensor y_, dsum_, dx_;
};

// One GPU layer per layer of `host`, recursively (its layers' visits of the Mirror in layers.cpp,
// beside the GPU layers themselves: a new kind of layer adds its GPU form and its visit in one file).
std::unique_ptr<GpuSequential> mirror(GpuContext& ctx, DeviceArenas& arenas, const Sequential<float>& host);

}  // namespace hpc::nn::cuda

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
#include "nn/cuda/context.hpp"

namespace hpc::nn::cuda {

// Device arenas laid out as a host ParamStore: values, gradients and buffers at the host
// slots' offsets.
class DeviceArenas {
 public:
  explicit DeviceArenas(const ParamStore<float>& layout);
  float* value(int slot) const { return at(values_, layout_->slots().at(slot).offset); }
  float* grad(int slot) const { return at(grads_, layout_->slots().at(slot).offset); }
  float* buffer(int slot) const { return at(buffers_, layout_->buffer_slots().at(slot).offset); }
  Tensor& values() { return values_; }
  Tensor& grads() { return grads_; }
  Tensor& buffers() { return buffers_; }

 private:
  static float* at(const Tensor& t, int64_t offset) { return t.data<float>() + offset; }
  const ParamStore<float>* layout_;
  Tensor values_, grads_, buffers_;
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
  ~ConvGpu() override;
  const Tensor& forward(const Tensor& x, bool train) override;
  const Tensor& backward(const Tensor& dy, bool need_dx) override;

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
  cudnnFilterDescriptor_t filter_ = nullptr;
  cudnnConvolutionDescriptor_t conv_fwd_ = nullptr, conv_bwd_data_ = nullptr, conv_bwd_filter_ = nullptr;
  TensorDesc x_desc_, y_desc_, bias_desc_;
  int64_t described_n_ = -1;
  std::map<int64_t, Plan> plans_;
  int64_t weight_count_ = 0;
  const void* weight_used_ = nullptr;  // the fp32 weight, or this step's 16-bit copy
  Tensor x_, y_, dx_, weight_lp_, bias_lp_, dweight_lp_;
  Tensor sums_work_;  // the bias gradient's scratch (kernels::channel_sums_work_bytes)
};

// BatchNorm [+ ReLU] [+ max pool]: the fusions of the CPU layer, as three cuDNN/kernel passes.
class BatchNormGpu final : public GpuLayer {
 public:
  BatchNormGpu(GpuContext& ctx, DeviceArenas& arenas, Geometry in, bool relu, int64_t pool_kernel,
               int64_t pool_stride, double momentum, double eps, int gamma, int beta, int running_mean,
               int running_var);
  ~BatchNormGpu() override;
  const Tensor& forward(const Tensor& x, bool train) override;
  const Tensor& backward(const Tensor& dy, bool need_dx) override;

 private:
  GpuContext& ctx_;
  DeviceArenas& arenas_;
  Geometry in_, pooled_;
  bool relu_;
  int64_t pool_kernel_;
  double momentum_, eps_;
  int gamma_, beta_, running_mean_, running_var_;
  cudnnPoolingDescriptor_t pool_ = nullptr;
  TensorDesc x_desc_, pooled_desc_, stats_desc_;
  int64_t described_n_ = -1;
  DType io_;  // the type it computes in: GpuContext::norm_type()
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

// Max pooling (kernel x kernel, stride) or global average pooling (the whole image).
class PoolGpu final : public GpuLayer {
 public:
  enum class Kind { Max, GlobalAverage };
  PoolGpu(GpuContext& ctx, Kind kind, Geometry in, int64_t kernel, int64_t stride);
  ~PoolGpu() override;
  const Tensor& forward(const Tensor& x, bool train) override;
  const Tensor& backward(const Tensor& dy, bool need_dx) override;

 private:
  GpuContext& ctx_;
  Kind kind_;
  Geometry in_, out_;
  cudnnPoolingDescriptor_t pool_ = nullptr;
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
  const void* weight_used_ = nullptr;  // this step's 16-bit copy of the weight (mixed precision)
  Tensor x_, y_, dx_, weight_lp_, bias_lp_;
  Tensor sums_work_;  // the 16-bit bias gradient's scratch (kernels::channel_sums_work_bytes)
};

// relu(main(x) + shortcut(x)); an empty shortcut is the identity.
class ResidualGpu final : public GpuLayer {
 public:
  ResidualGpu(GpuContext& ctx, std::unique_ptr<GpuSequential> main, std::unique_ptr<GpuSequential> shortcut);
  const Tensor& forward(const Tensor& x, bool train) override;
  const Tensor& backward(const Tensor& dy, bool need_dx) override;

 private:
  GpuContext& ctx_;
  std::unique_ptr<GpuSequential> main_, shortcut_;
  Tensor y_, dsum_, dx_;
};

}  // namespace hpc::nn::cuda

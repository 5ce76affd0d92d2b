#include "nn/cuda/layers.hpp"

#include <algorithm>

#include "core/device.hpp"
#include "kernels/kernels.hpp"
#include "nn/layer.hpp"

namespace hpc::nn::cuda {
namespace {

constexpr float kOne = 1.0f, kZero = 0.0f;
constexpr int kMaxAlgos = 16;  // more than cuDNN has for any direction

int to_int(int64_t v) {
  HPC_CHECK(v >= 0 && v <= INT32_MAX, "GPU layer dimension ", v, " does not fit the libraries' int");
  return static_cast<int>(v);
}

// Picks the first of cuDNN's candidates that succeeded, fits the workspace limit, and meets
// the settings: deterministic when asked; in fp32 only plain FMA math (CUDNN_DEFAULT_MATH may
// use TF32 on Ampere and later); never a conversion of fp32 inputs to fp16.
//
// Where the candidates come from matters as much: cudnnFind* times them on the GPU, and the
// fastest can differ from run to run, after a resume and between ranks, and with it the bits.
// Deterministic runs therefore take cuDNN's heuristic order (cudnnGet*_v7), fixed for a given
// GPU and cuDNN; the others the measured order, as PyTorch's cudnn.benchmark.
//
// cudnnFind* runs every algorithm on memory it takes with cudaMalloc itself (input, filter,
// output, each algorithm's workspace). At a batch shape first seen late in a run (an evaluation
// batch, the last smaller one) the caching allocator holds a whole step's freed buffers, which
// cudaMalloc cannot have: the search would fail outright (CUDNN_STATUS_ALLOC_FAILED) or drop the
// algorithms whose workspace no longer fits. So the cache goes back to the driver first
// (release_cache_for_find), as cuDNN asks the search to run before layer data is allocated.
template <class Perf>
const Perf& choose(const Perf* perf, int count, const GpuSettings& s, const char* what) {
  for (int i = 0; i < count; ++i) {
    const Perf& p = perf[i];
    if (p.status != CUDNN_STATUS_SUCCESS || p.memory > s.workspace_limit) continue;
    if (s.deterministic && p.determinism != CUDNN_DETERMINISTIC) continue;
    if (s.math == Math::Fp32 && p.mathType != CUDNN_FMA_MATH) continue;
    if (p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) continue;
    return p;
  }
  throw Error(ErrorKind::Internal, detail::concat("cuDNN offers no ", what, " algorithm for this convolution",
                                                  s.deterministic ? " that is deterministic" : "",
                                                  s.math == Math::Fp32 ? " in plain fp32" : ""));
}

// Before a cudnnFind* (see choose()): the cached blocks back to the driver. Never inside a CUDA
// graph's capture: a plan is made in an eager step (gpu_engine's settle step). Asked, not assumed:
// cudaFree (and the search's own timing) inside a capture would end it with an error that names
// neither; this names the bug.
void release_cache_for_find(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  HPC_CHECK(capture == cudaStreamCaptureStatusNone,
            "cuDNN's algorithm search (--no-deterministic) for a batch shape first seen inside a CUDA graph's capture");
  device::empty_cache();
}

// Compute type float in every precision: 16-bit convolutions accumulate in fp32 (cuDNN's
// "pseudo" half and bfloat16 configurations).
ConvDesc make_conv(int64_t stride, int64_t padding, cudnnMathType_t math) {
  ConvDesc d;
  CUDNN_CHECK(cudnnCreateConvolutionDescriptor(d.out()));
  CUDNN_CHECK(cudnnSetConvolution2dDescriptor(d.get(), to_int(padding), to_int(padding), to_int(stride), to_int(stride),
                                              1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  CUDNN_CHECK(cudnnSetConvolutionMathType(d.get(), math));
  return d;
}

Shape nhwc_shape(int64_t n, const Geometry& g, bool image) {
  return image ? Shape{n, g.h, g.w, g.c} : Shape{n, g.c};
}

cudnnMathType_t math_of(Math m) {
  switch (m) {
    case Math::Fp32: return CUDNN_FMA_MATH;
    case Math::Tf32: return CUDNN_DEFAULT_MATH;
    default: return CUDNN_TENSOR_OP_MATH;  // bf16, fp16: tensor cores
  }
}

cudaDataType_t cuda_type(DType t) {
  return t == DType::BF16 ? CUDA_R_16BF : t == DType::F16 ? CUDA_R_16F : CUDA_R_32F;
}

// x as type t: x itself, or its conversion into buf.
const Tensor& as_type(GpuContext& ctx, const Tensor& x, DType t, Tensor& buf) {
  if (x.dtype() == t) return x;
  ensure(buf, x.shape(), t);
  kernels::convert(x.dtype(), x.raw(), t, buf.raw(), x.numel(), 1.0f, nullptr, ctx.stream());
  return buf;
}

// Mixed precision's bias term, for linear and convolution layers alike (channels last: the
// output is rows x channels), as a cuBLAS product with a vector of ones accumulated in fp32:
// cuDNN's bias calls do not take every 16-bit type.
// y^T[channels x rows] += b[channels x 1] . ones[1 x rows], b the bias's 16-bit copy.
void add_bias_low(GpuContext& ctx, const void* b, void* y, int channels, int rows) {
  const cublas::Api& blas = ctx.blas();
  const cudaDataType_t t = cuda_type(ctx.act());
  CUBLAS_CHECK(blas.GemmEx(ctx.cublas(), CUBLAS_OP_N, CUBLAS_OP_N, channels, rows, 1, &kOne, b, t, channels,
                           ctx.ones(rows, ctx.act()), t, 1, &kOne, y, t, channels, CUBLAS_COMPUTE_32F,
                           CUBLAS_GEMM_DEFAULT));
}

// db[c] = the sum over rows of dy[r][c] (channels last, any precision), into the fp32 arena
// with the loss scale divided out, for convolution and linear layers alike: our deterministic
// per-channel sums (kernels/channel_sums.cu). cuDNN's cudnnConvolutionBackwardBias took 47% of
// the cnn's step on an H200; in 16 bits this was a cuBLAS product with a vector of ones.
void bias_grad(GpuContext& ctx, const Tensor& dy, int64_t channels, float* db, Tensor& work) {
  const int64_t rows = dy.numel() / channels;
  ensure(work, Shape{static_cast<int64_t>((kernels::channel_sums_work_bytes(rows, channels) + 7) / 8)}, DType::F64);
  kernels::channel_sums(dy.dtype(), dy.raw(), rows, channels, ctx.grad_factor(), db, work.raw(), ctx.stream());
}

}  // namespace

// ---- arenas, geometry, sequential ------------------------------------------------------------

DeviceArenas::DeviceArenas(const ParamStore<float>& layout)
    : layout_(&layout),
      values_(layout.values().shape(), DType::F32, DeviceKind::CUDA),
      grads_(layout.grads().shape(), DType::F32, DeviceKind::CUDA),
      buffers_(layout.buffers().shape(), DType::F32, DeviceKind::CUDA) {}

void DeviceArenas::refresh_low(DType t, cudaStream_t stream) {
  ensure(values_low_, values_.shape(), t);  // allocates once: a captured step's refresh allocates nothing
  kernels::convert(DType::F32, values_.raw(), t, values_low_.raw(), values_.numel(), 1.0f, nullptr, stream);
}

void* DeviceArenas::grad_low(int slot, DType t) {
  ensure(grads_low_, grads_.shape(), t);  // allocates once (the first backward: before any capture)
  const auto offset = static_cast<size_t>(layout_->slots().at(slot).offset);
  return static_cast<char*>(grads_low_.raw()) + offset * dtype_size(t);
}

void DeviceArenas::defer_grad(int slot) {
  HPC_CHECK(grads_low_.defined(), "a 16-bit gradient deferred before any grad_low");
  const auto& s = layout_->slots().at(slot);
  deferred_.push_back({s.offset, s.shape.numel()});
}

void DeviceArenas::land_grads(float factor, cudaStream_t stream) {
  if (deferred_.empty()) return;
  kernels::convert_spans(grads_low_.dtype(), grads_low_.raw(), grads_.data<float>(), deferred_, factor, stream);
  deferred_.clear();
}

const void* DeviceArenas::value_low(int slot) const {
  HPC_CHECK(values_low_.defined(), "the 16-bit copy of the parameters read before any refresh_low");
  const auto offset = static_cast<size_t>(layout_->slots().at(slot).offset);
  return static_cast<const char*>(values_low_.raw()) + offset * dtype_size(values_low_.dtype());
}

Geometry Geometry::of(const Shape& s) {
  if (s.rank() == 3) return {s[0], s[1], s[2]};
  HPC_CHECK(s.rank() == 1, "GPU layers take H x W x C or F per sample, not ", s.str());
  return {1, 1, s[0]};
}

const Tensor& GpuSequential::forward(const Tensor& x, bool train) {
  const Tensor* cur = &x;
  for (auto& l : layers_) cur = &l->forward(*cur, train);
  return *cur;
}

const Tensor& GpuSequential::backward(const Tensor& dy, bool need_dx) {
  return backward_with(dy, need_dx, [](size_t) {});
}

const Tensor& GpuSequential::backward_with(const Tensor& dy, bool need_dx,
                                           const std::function<void(size_t)>& after_layer) {
  const Tensor* cur = &dy;
  for (size_t i = layers_.size(); i-- > 0;) {
    cur = &layers_[i]->backward(*cur, need_dx || i > 0);
    after_layer(i);
  }
  return *cur;
}

// ---- convolution ------------------------------------------------------------------------------

ConvGpu::ConvGpu(GpuContext& ctx, DeviceArenas& arenas, Geometry in, Geometry out, int64_t kernel, int64_t stride,
                 int64_t padding, int weight_slot, int bias_slot)
    : ctx_(ctx), arenas_(arenas), in_(in), out_(out), weight_(weight_slot), bias_(bias_slot) {
  CUDNN_CHECK(cudnnCreateFilterDescriptor(filter_.out()));
  CUDNN_CHECK(cudnnSetFilter4dDescriptor(filter_.get(), cudnn_type(ctx.act()), CUDNN_TENSOR_NHWC, to_int(out.c),
                                         to_int(in.c), to_int(kernel), to_int(kernel)));
  // One descriptor per direction: each carries the math type of the algorithm chosen for it.
  const cudnnMathType_t math = math_of(ctx.settings().math);
  conv_fwd_ = make_conv(stride, padding, math);
  conv_bwd_data_ = make_conv(stride, padding, math);
  conv_bwd_filter_ = make_conv(stride, padding, math);
  bias_desc_.set_nhwc(1, 1, 1, out.c);  // fp32 only: mixed precision adds biases through cuBLAS
}

ConvGpu::Plan& ConvGpu::plan(int64_t n) {
  if (n != described_n_) {
    x_desc_.set_nhwc(n, in_.h, in_.w, in_.c, ctx_.act());
    y_desc_.set_nhwc(n, out_.h, out_.w, out_.c, ctx_.act());
    described_n_ = n;
  }
  auto it = plans_.find(n);
  if (it != plans_.end()) return it->second;
  // Chosen once per batch size (see choose() for how), then cached for the run.
  int got = 0;
  Plan p;
  const GpuSettings& s = ctx_.settings();
  const bool measure = !s.deterministic;
  // The search starts from the precision's math type, not the one the last plan's algorithm
  // left on the descriptor (which could narrow it to FMA kernels).
  CUDNN_CHECK(cudnnSetConvolutionMathType(conv_fwd_.get(), math_of(s.math)));
  CUDNN_CHECK(cudnnSetConvolutionMathType(conv_bwd_filter_.get(), math_of(s.math)));
  if (measure) release_cache_for_find(ctx_.stream());
  cudnnConvolutionFwdAlgoPerf_t fwd[kMaxAlgos];
  CUDNN_CHECK(measure ? cudnnFindConvolutionForwardAlgorithm(ctx_.cudnn(), x_desc_.get(), filter_.get(),
                                                             conv_fwd_.get(), y_desc_.get(), kMaxAlgos, &got, fwd)
                      : cudnnGetConvolutionForwardAlgorithm_v7(ctx_.cudnn(), x_desc_.get(), filter_.get(),
                                                               conv_fwd_.get(), y_desc_.get(), kMaxAlgos, &got, fwd));
  const auto& f = choose(fwd, got, s, "forward");
  p.fwd = f.algo, p.fwd_bytes = f.memory, p.fwd_math = f.mathType;
  cudnnConvolutionBwdFilterAlgoPerf_t bf[kMaxAlgos];
  CUDNN_CHECK(
      measure
          ? cudnnFindConvolutionBackwardFilterAlgorithm(ctx_.cudnn(), x_desc_.get(), y_desc_.get(),
                                                        conv_bwd_filter_.get(), filter_.get(), kMaxAlgos, &got, bf)
          : cudnnGetConvolutionBackwardFilterAlgorithm_v7(ctx_.cudnn(), x_desc_.get(), y_desc_.get(),
                                                          conv_bwd_filter_.get(), filter_.get(), kMaxAlgos, &got, bf));
  const auto& w = choose(bf, got, s, "backward-filter");
  p.bwd_filter = w.algo, p.bwd_filter_bytes = w.memory, p.bwd_filter_math = w.mathType;
  return plans_.emplace(n, p).first->second;
}

// Separate from plan(): the first layer never computes dx, and a shape cuDNN has no suitable
// backward-data algorithm for must not stop a run that does not need one.
void ConvGpu::choose_backward_data(Plan& p) {
  int got = 0;
  const GpuSettings& s = ctx_.settings();
  CUDNN_CHECK(cudnnSetConvolutionMathType(conv_bwd_data_.get(), math_of(s.math)));
  if (!s.deterministic) release_cache_for_find(ctx_.stream());
  cudnnConvolutionBwdDataAlgoPerf_t bd[kMaxAlgos];
  CUDNN_CHECK(!s.deterministic
                  ? cudnnFindConvolutionBackwardDataAlgorithm(ctx_.cudnn(), filter_.get(), y_desc_.get(),
                                                              conv_bwd_data_.get(), x_desc_.get(), kMaxAlgos, &got, bd)
                  : cudnnGetConvolutionBackwardDataAlgorithm_v7(ctx_.cudnn(), filter_.get(), y_desc_.get(),
                                                                conv_bwd_data_.get(), x_desc_.get(), kMaxAlgos, &got,
                                                                bd));
  const auto& d = choose(bd, got, s, "backward-data");
  p.bwd_data = d.algo, p.bwd_data_bytes = d.memory, p.bwd_data_math = d.mathType;
  p.have_bwd_data = true;
}

const Tensor& ConvGpu::forward(const Tensor& x, bool /*train*/) {
  const int64_t n = x.shape()[0];
  HPC_CHECK(x.numel() == n * in_.size(), "conv input ", x.shape().str());
  const Plan& p = plan(n);
  x_ = x;
  ensure(y_, Shape{n, out_.h, out_.w, out_.c}, ctx_.act());
  // Mixed precision: the 16-bit copies of the fp32 weight and bias (as autocast makes).
  const bool low = ctx_.act() != DType::F32;
  weight_used_ = low ? arenas_.value_low(weight_) : arenas_.value(weight_);
  CUDNN_CHECK(cudnnSetConvolutionMathType(conv_fwd_.get(), p.fwd_math));
  CUDNN_CHECK(cudnnConvolutionForward(ctx_.cudnn(), &kOne, x_desc_.get(), x.raw(), filter_.get(), weight_used_,
                                      conv_fwd_.get(), p.fwd, ctx_.workspace(p.fwd_bytes), p.fwd_bytes, &kZero,
                                      y_desc_.get(), y_.raw()));
  if (bias_ >= 0 && low)
    add_bias_low(ctx_, arenas_.value_low(bias_), y_.raw(), to_int(out_.c), to_int(n * out_.h * out_.w));
  else if (bias_ >= 0)
    CUDNN_CHECK(cudnnAddTensor(ctx_.cudnn(), &kOne, bias_desc_.get(), arenas_.value(bias_), &kOne, y_desc_.get(),
                               y_.raw()));
  return y_;
}

const Tensor& ConvGpu::backward(const Tensor& dy, bool need_dx) {
  const int64_t n = x_.shape()[0];
  Plan& p = plan(n);
  // In mixed precision cuDNN writes the weight gradient in the activations' type (the
  // filter's), into the arenas' 16-bit gradients; it reaches the fp32 arena converted, the loss
  // scale divided out, when the arenas land their deferred gradients (DeviceArenas).
  const bool low = ctx_.act() != DType::F32;
  if (bias_ >= 0) bias_grad(ctx_, dy, out_.c, arenas_.grad(bias_), sums_work_);
  void* dweight = low ? arenas_.grad_low(weight_, ctx_.act()) : arenas_.grad(weight_);
  CUDNN_CHECK(cudnnSetConvolutionMathType(conv_bwd_filter_.get(), p.bwd_filter_math));
  CUDNN_CHECK(cudnnConvolutionBackwardFilter(ctx_.cudnn(), &kOne, x_desc_.get(), x_.raw(), y_desc_.get(), dy.raw(),
                                             conv_bwd_filter_.get(), p.bwd_filter, ctx_.workspace(p.bwd_filter_bytes),
                                             p.bwd_filter_bytes, &kZero, filter_.get(), dweight));
  if (low) arenas_.defer_grad(weight_);
  if (!need_dx) return dx_;
  if (!p.have_bwd_data) choose_backward_data(p);
  // dx into this layer's buffer, or into the target a residual block gave (set_dx_target),
  // there added to what it holds: cuDNN's beta = 1 does the join's add as it writes.
  Tensor& dx = dx_target_ ? *dx_target_ : dx_;
  if (accumulate_dx_)
    HPC_CHECK(dx.shape() == x_.shape() && dx.dtype() == ctx_.act(), "convolution gradient of ", x_.shape().str(),
              " added to ", dx.shape().str());
  else
    ensure(dx, x_.shape(), ctx_.act());
  CUDNN_CHECK(cudnnSetConvolutionMathType(conv_bwd_data_.get(), p.bwd_data_math));
  CUDNN_CHECK(cudnnConvolutionBackwardData(ctx_.cudnn(), &kOne, filter_.get(), weight_used_, y_desc_.get(),
                                           dy.raw(), conv_bwd_data_.get(), p.bwd_data, ctx_.workspace(p.bwd_data_bytes),
                                           p.bwd_data_bytes, accumulate_dx_ ? &kOne : &kZero, x_desc_.get(),
                                           dx.raw()));
  return dx;
}

void ConvGpu::set_dx_target(Tensor* target, bool accumulate) {
  HPC_CHECK(target || !accumulate, "a convolution can add its input gradient only to a given tensor");
  dx_target_ = target;
  accumulate_dx_ = accumulate;
}

// ---- batch norm [+ ReLU] [+ max pool] -----------------------------------------------------------

BatchNormGpu::BatchNormGpu(GpuContext& ctx, DeviceArenas& arenas, Geometry in, bool relu, int64_t pool_kernel,
                           int64_t pool_stride, double momentum, double eps, int gamma, int beta, int running_mean,
                           int running_var)
    : ctx_(ctx),
      arenas_(arenas),
      in_(in),
      pooled_(in),
      relu_(relu),
      pool_kernel_(pool_kernel),
      pool_stride_(pool_stride),
      momentum_(momentum),
      eps_(std::max(eps, CUDNN_BN_MIN_EPSILON)),
      gamma_(gamma),
      beta_(beta),
      running_mean_(running_mean),
      running_var_(running_var),
      io_(ctx.norm_type()) {
  if (pool_kernel_ > 0) {
    pooled_.h = (in.h - pool_kernel) / pool_stride + 1;
    pooled_.w = (in.w - pool_kernel) / pool_stride + 1;
    CUDNN_CHECK(cudnnCreatePoolingDescriptor(pool_.out()));
    CUDNN_CHECK(cudnnSetPooling2dDescriptor(pool_.get(), CUDNN_POOLING_MAX_DETERMINISTIC, CUDNN_PROPAGATE_NAN,
                                            to_int(pool_kernel), to_int(pool_kernel), 0, 0, to_int(pool_stride),
                                            to_int(pool_stride)));
  }
}

const Tensor& BatchNormGpu::forward(const Tensor& x_in, bool train) {
  const Tensor& x = as_type(ctx_, x_in, io_, x_wide_);
  const int64_t n = x.shape()[0];
  HPC_CHECK(x.numel() == n * in_.size(), "batch norm input ", x.shape().str());
  if (n != described_n_) {
    x_desc_.set_nhwc(n, in_.h, in_.w, in_.c, io_);
    pooled_desc_.set_nhwc(n, pooled_.h, pooled_.w, pooled_.c, io_);
    CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(stats_desc_.get(), x_desc_.get(), CUDNN_BATCHNORM_SPATIAL));
    described_n_ = n;
  }
  HPC_REQUIRE(!train || n * in_.h * in_.w > 1, "batch norm needs more than one value per channel in training (batch "
              "of ", n, " sample(s)); use a larger batch size");
  x_ = x;
  ensure(y_, x.shape(), io_);
  ensure(save_mean_, Shape{in_.c});
  ensure(save_invstd_, Shape{in_.c});
  const int64_t rows = n * in_.h * in_.w;
  // A residual block's join (join()), fused into the apply pass when it comes in this layer's
  // type; otherwise added after, as the block would.
  const bool fuse_join = train && join_ && join_->dtype() == io_ && join_->shape() == x.shape();
  if (train) {
    // Our NHWC kernels, ReLU fused (cuDNN's legacy calls ran NCHW kernels on this layout:
    // kernels/batch_norm.cu). The running variance takes the unbiased batch variance, as
    // PyTorch's and the CPU layer's.
    ensure(work_, Shape{static_cast<int64_t>((kernels::batch_norm_work_bytes(io_, rows, in_.c) + 7) / 8)},
           DType::F64);
    kernels::batch_norm_forward_train(io_, x.raw(), y_.raw(), rows, in_.c, arenas_.value(gamma_),
                                      arenas_.value(beta_), arenas_.buffer(running_mean_),
                                      arenas_.buffer(running_var_), momentum_, eps_, relu_ || fuse_join,
                                      save_mean_.data<float>(), save_invstd_.data<float>(), work_.raw(),
                                      ctx_.stream(), fuse_join ? join_->raw() : nullptr);
  } else {
    CUDNN_CHECK(cudnnBatchNormalizationForwardInference(
        ctx_.cudnn(), CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, x_desc_.get(), x.raw(), x_desc_.get(), y_.raw(),
        stats_desc_.get(), arenas_.value(gamma_), arenas_.value(beta_), arenas_.buffer(running_mean_),
        arenas_.buffer(running_var_), eps_));
    if (relu_) kernels::relu_forward(y_.dtype(), y_.raw(), y_.raw(), y_.numel(), ctx_.stream());
  }
  if (join_ && !fuse_join) {  // the join the apply pass could not take: y = relu(y + residual)
    Tensor& out = y_.dtype() == ctx_.act() ? y_ : y_low_;
    as_type(ctx_, y_, ctx_.act(), y_low_);  // fills y_low_ when the types differ
    HPC_CHECK(join_->dtype() == out.dtype() && join_->shape() == out.shape(), "residual join of ",
              join_->shape().str(), " onto ", out.shape().str());
    kernels::add(out.dtype(), out.raw(), join_->raw(), out.raw(), out.numel(), ctx_.stream());
    kernels::relu_forward(out.dtype(), out.raw(), out.raw(), out.numel(), ctx_.stream());
    return out;
  }
  if (!pool_.get()) return as_type(ctx_, y_, ctx_.act(), y_low_);
  ensure(pooled_y_, nhwc_shape(n, pooled_, true), io_);
  CUDNN_CHECK(cudnnPoolingForward(ctx_.cudnn(), pool_.get(), &kOne, x_desc_.get(), y_.raw(), &kZero, pooled_desc_.get(),
                                  pooled_y_.raw()));
  return as_type(ctx_, pooled_y_, ctx_.act(), y_low_);
}

void BatchNormGpu::join(const Tensor* residual) {
  HPC_CHECK(!residual || joinable(), "a batch norm with its own ReLU or pool cannot take a residual join");
  join_ = residual;
}

const Tensor& BatchNormGpu::backward(const Tensor& dy_in, bool /*need_dx*/) {
  // The backward always writes dx; the first layer's is simply not used.
  const Tensor* d = &as_type(ctx_, dy_in, io_, dy_wide_);
  if (pool_.get()) {
    ensure(dnorm_, x_.shape(), io_);
    // Ours, not cuDNN's deterministic max-pool backward (2.4 ms at 206 GB/s for ResNet-50's stem).
    kernels::max_pool_backward(io_, y_.raw(), d->raw(), dnorm_.raw(), x_.shape()[0], in_.h, in_.w, in_.c,
                               to_int(pool_kernel_), to_int(pool_stride_), 0, ctx_.stream());  // FusedPool: unpadded
    d = &dnorm_;
  }
  ensure(dx_, x_.shape(), io_);
  // dx keeps the loss scale (the backward pass goes on with it); dgamma and dbeta, fp32 in
  // every precision, have it divided out. The fused ReLU's mask is applied inside (recomputed
  // from x): no pass of its own.
  const int64_t rows = x_.shape()[0] * in_.h * in_.w;
  kernels::batch_norm_backward(io_, x_.raw(), d->raw(), dx_.raw(), rows, in_.c, arenas_.value(gamma_),
                               save_mean_.data<float>(), save_invstd_.data<float>(), ctx_.grad_factor(),
                               arenas_.grad(gamma_), arenas_.grad(beta_), work_.raw(), ctx_.stream(), relu_);
  return as_type(ctx_, dx_, ctx_.act(), dx_low_);
}

// ---- ReLU, pooling, flatten ----------------------------------------------------------------------

const Tensor& ReluGpu::forward(const Tensor& x, bool /*train*/) {
  ensure(y_, x.shape(), x.dtype());
  kernels::relu_forward(x.dtype(), x.raw(), y_.raw(), x.numel(), ctx_.stream());
  return y_;
}

const Tensor& ReluGpu::backward(const Tensor& dy, bool /*need_dx*/) {
  ensure(dx_, dy.shape(), dy.dtype());
  kernels::relu_backward(dy.dtype(), y_.raw(), dy.raw(), dx_.raw(), dy.numel(), ctx_.stream());
  return dx_;
}

PoolGpu::PoolGpu(GpuContext& ctx, Kind kind, Geometry in, int64_t kernel, int64_t stride, int64_t padding)
    : ctx_(ctx),
      kind_(kind),
      in_(in),
      out_(in),
      kernel_(kernel),
      stride_(stride),
      padding_(padding),
      io_(ctx.norm_type()) {
  // The global average is one unpadded window over the whole image. cuDNN's max pooling never
  // picks a padding cell, as nn::MaxPool2d.
  const bool global = kind == Kind::GlobalAverage;
  const int64_t kh = global ? in.h : kernel, kw = global ? in.w : kernel;
  const int64_t sh = global ? in.h : stride, sw = global ? in.w : stride;
  const int64_t pad = global ? 0 : padding;
  out_.h = (in.h + 2 * pad - kh) / sh + 1;
  out_.w = (in.w + 2 * pad - kw) / sw + 1;
  CUDNN_CHECK(cudnnCreatePoolingDescriptor(pool_.out()));
  CUDNN_CHECK(cudnnSetPooling2dDescriptor(
      pool_.get(), global ? CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING : CUDNN_POOLING_MAX_DETERMINISTIC,
      CUDNN_PROPAGATE_NAN, to_int(kh), to_int(kw), to_int(pad), to_int(pad), to_int(sh), to_int(sw)));
}


const Tensor& PoolGpu::forward(const Tensor& x_in, bool /*train*/) {
  const Tensor& x = as_type(ctx_, x_in, io_, x_wide_);
  const int64_t n = x.shape()[0];
  HPC_CHECK(x.numel() == n * in_.size(), "pooling input ", x.shape().str());
  if (n != described_n_) {
    x_desc_.set_nhwc(n, in_.h, in_.w, in_.c, io_);
    y_desc_.set_nhwc(n, out_.h, out_.w, out_.c, io_);
    described_n_ = n;
  }
  x_ = x;
  // The global average pool ends in features (N x C), as the CPU layer's output.
  ensure(y_, nhwc_shape(n, out_, kind_ == Kind::Max), io_);
  CUDNN_CHECK(cudnnPoolingForward(ctx_.cudnn(), pool_.get(), &kOne, x_desc_.get(), x.raw(), &kZero, y_desc_.get(),
                                  y_.raw()));
  return as_type(ctx_, y_, ctx_.act(), y_low_);
}

const Tensor& PoolGpu::backward(const Tensor& dy_in, bool /*need_dx*/) {
  const Tensor& dy = as_type(ctx_, dy_in, io_, dy_wide_);
  ensure(dx_, x_.shape(), io_);
  if (kind_ == Kind::Max)  // ours: the CPU layer's winners, faster than cuDNN's deterministic backward
    kernels::max_pool_backward(io_, x_.raw(), dy.raw(), dx_.raw(), x_.shape()[0], in_.h, in_.w, in_.c,
                               to_int(kernel_), to_int(stride_), to_int(padding_), ctx_.stream());
  else
    CUDNN_CHECK(cudnnPoolingBackward(ctx_.cudnn(), pool_.get(), &kOne, y_desc_.get(), y_.raw(), y_desc_.get(), dy.raw(),
                                     x_desc_.get(), x_.raw(), &kZero, x_desc_.get(), dx_.raw()));
  return as_type(ctx_, dx_, ctx_.act(), dx_low_);
}

const Tensor& FlattenGpu::forward(const Tensor& x, bool /*train*/) {
  in_ = x.shape();
  const int64_t n = in_[0];
  y_ = x.reshape(Shape{n, x.numel() / std::max<int64_t>(n, 1)});  // NHWC: flattening moves nothing
  return y_;
}

const Tensor& FlattenGpu::backward(const Tensor& dy, bool /*need_dx*/) {
  dx_ = dy.reshape(in_);
  return dx_;
}

// ---- linear ---------------------------------------------------------------------------------------
// Row-major y[n x out] = x[n x in] W^T + b, W[out x in] as on the CPU. cuBLAS is column-major:
// a row-major M[r x c] is its column-major M^T[c x r], so every product below is the CPU's
// read transposed.

LinearGpu::LinearGpu(GpuContext& ctx, DeviceArenas& arenas, int64_t in, int64_t out, int weight_slot, int bias_slot)
    : ctx_(ctx), arenas_(arenas), in_(in), out_(out), weight_(weight_slot), bias_(bias_slot) {}

const Tensor& LinearGpu::forward(const Tensor& x, bool /*train*/) {
  const int64_t n = x.shape()[0];
  HPC_CHECK(x.shape() == Shape({n, in_}), "linear input ", x.shape().str());
  x_ = x;
  ensure(y_, Shape{n, out_}, ctx_.act());
  const int o = to_int(out_), i = to_int(in_), m = to_int(n);
  if (ctx_.act() != DType::F32) return forward_low(x, o, i, m);
  const cublas::Api& blas = ctx_.blas();
  // y^T[out x n] = W[out x in] . x^T[in x n]
  CUBLAS_CHECK(blas.Sgemm(ctx_.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, o, m, i, &kOne, arenas_.value(weight_), i,
                          x.data<float>(), i, &kZero, y_.data<float>(), o));
  if (bias_ >= 0)  // y^T += b . ones^T
    CUBLAS_CHECK(blas.Sger(ctx_.cublas(), o, m, &kOne, arenas_.value(bias_), 1, ctx_.ones(n), 1, y_.data<float>(), o));
  return y_;
}

const Tensor& LinearGpu::backward(const Tensor& dy, bool need_dx) {
  const int64_t n = x_.shape()[0];
  const int o = to_int(out_), i = to_int(in_), m = to_int(n);
  if (ctx_.act() != DType::F32) return backward_low(dy, need_dx, o, i, m);
  const cublas::Api& blas = ctx_.blas();
  // dW^T[in x out] = x^T[in x n] . dy[n x out]
  CUBLAS_CHECK(blas.Sgemm(ctx_.cublas(), CUBLAS_OP_N, CUBLAS_OP_T, i, o, m, &kOne, x_.data<float>(), i,
                          dy.data<float>(), o, &kZero, arenas_.grad(weight_), i));
  if (bias_ >= 0)  // db = dy^T[out x n] . ones
    CUBLAS_CHECK(blas.Sgemv(ctx_.cublas(), CUBLAS_OP_N, o, m, &kOne, dy.data<float>(), o, ctx_.ones(n), 1, &kZero,
                            arenas_.grad(bias_), 1));
  if (!need_dx) return dx_;
  ensure(dx_, Shape{n, in_});
  // dx^T[in x n] = W^T[in x out] . dy^T[out x n]
  CUBLAS_CHECK(blas.Sgemm(ctx_.cublas(), CUBLAS_OP_N, CUBLAS_OP_N, i, m, o, &kOne, arenas_.value(weight_), i,
                          dy.data<float>(), o, &kZero, dx_.data<float>(), i));
  return dx_;
}

// Mixed precision: the same products through cublasGemmEx on 16-bit operands, accumulated in
// fp32 (CUBLAS_COMPUTE_32F); the bias enters as a rank-1 product with a vector of ones.
const Tensor& LinearGpu::forward_low(const Tensor& x, int o, int i, int m) {
  const cublas::Api& blas = ctx_.blas();
  const cudaDataType_t t = cuda_type(ctx_.act());
  weight_used_ = arenas_.value_low(weight_);
  CUBLAS_CHECK(blas.GemmEx(ctx_.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, o, m, i, &kOne, weight_used_, t, i, x.raw(), t, i,
                           &kZero, y_.raw(), t, o, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  if (bias_ >= 0) add_bias_low(ctx_, arenas_.value_low(bias_), y_.raw(), o, m);
  return y_;
}

// The parameter gradients go straight into the fp32 arena (16-bit operands, fp32 output), the
// loss scale divided out through alpha.
const Tensor& LinearGpu::backward_low(const Tensor& dy, bool need_dx, int o, int i, int m) {
  const cublas::Api& blas = ctx_.blas();
  const cudaDataType_t t = cuda_type(ctx_.act());
  const float unscale = ctx_.grad_factor();
  // dW^T[in x out] = x^T[in x n] . dy[n x out]
  CUBLAS_CHECK(blas.GemmEx(ctx_.cublas(), CUBLAS_OP_N, CUBLAS_OP_T, i, o, m, &unscale, x_.raw(), t, i, dy.raw(), t,
                           o, &kZero, arenas_.grad(weight_), CUDA_R_32F, i, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  if (bias_ >= 0) bias_grad(ctx_, dy, out_, arenas_.grad(bias_), sums_work_);
  if (!need_dx) return dx_;
  ensure(dx_, Shape{m, in_}, ctx_.act());
  // dx^T[in x n] = W^T[in x out] . dy^T[out x n]
  CUBLAS_CHECK(blas.GemmEx(ctx_.cublas(), CUBLAS_OP_N, CUBLAS_OP_N, i, m, o, &kOne, weight_used_, t, i, dy.raw(), t,
                           o, &kZero, dx_.raw(), t, i, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return dx_;
}

// ---- residual ---------------------------------------------------------------------------------------

ResidualGpu::ResidualGpu(GpuContext& ctx, std::unique_ptr<GpuSequential> main, std::unique_ptr<GpuSequential> shortcut)
    : ctx_(ctx), main_(std::move(main)), shortcut_(std::move(shortcut)) {
  // The fusions a block's layers allow: the join and its ReLU in the branch's last batch norm
  // (no ReLU or pool of its own); the input gradients' sum in the branches' first
  // convolutions. The main branch's first layer must not be the one that reads the block's
  // output gradient (dsum_): with the identity shortcut it writes its dx into dsum_.
  if (auto* bn = dynamic_cast<BatchNormGpu*>(main_->last()); bn && bn->joinable()) join_ = bn;
  if (main_->size() >= 2) main_conv_ = dynamic_cast<ConvGpu*>(main_->first());
  if (!shortcut_->empty()) short_conv_ = dynamic_cast<ConvGpu*>(shortcut_->first());
}

const Tensor& ResidualGpu::forward(const Tensor& x, bool train) {
  if (join_) {  // the shortcut first: the main branch's last batch norm adds it and applies the ReLU
    const Tensor& b = shortcut_->empty() ? x : shortcut_->forward(x, train);
    join_->join(&b);
    const Tensor& y = main_->forward(x, train);
    join_->join(nullptr);
    out_ = &y;
    return y;
  }
  const Tensor& a = main_->forward(x, train);
  const Tensor& b = shortcut_->empty() ? x : shortcut_->forward(x, train);
  ensure(y_, a.shape(), a.dtype());
  kernels::add(a.dtype(), a.raw(), b.raw(), y_.raw(), a.numel(), ctx_.stream());
  kernels::relu_forward(y_.dtype(), y_.raw(), y_.raw(), y_.numel(), ctx_.stream());
  out_ = &y_;
  return y_;
}

const Tensor& ResidualGpu::backward(const Tensor& dy, bool need_dx) {
  ensure(dsum_, dy.shape(), dy.dtype());
  kernels::relu_backward(dy.dtype(), out_->raw(), dy.raw(), dsum_.raw(), dy.numel(), ctx_.stream());
  // The add sends the same gradient into both branches; their input gradients sum.
  if (!need_dx) {
    main_->backward(dsum_, false);
    if (!shortcut_->empty()) shortcut_->backward(dsum_, false);
    return dx_;
  }
  // Summed as the first convolutions write them: with the identity shortcut into dsum_ itself
  // (only the main branch's last layer reads it, before its first writes), else into dx_,
  // which the shortcut's convolution fills first.
  if (main_conv_ && shortcut_->empty()) {
    main_conv_->set_dx_target(&dsum_, true);
    main_->backward(dsum_, true);
    main_conv_->set_dx_target(nullptr, false);
    return dsum_;
  }
  if (main_conv_ && short_conv_) {
    short_conv_->set_dx_target(&dx_, false);
    shortcut_->backward(dsum_, true);
    short_conv_->set_dx_target(nullptr, false);
    main_conv_->set_dx_target(&dx_, true);
    main_->backward(dsum_, true);
    main_conv_->set_dx_target(nullptr, false);
    return dx_;
  }
  const Tensor& dmain = main_->backward(dsum_, need_dx);
  const Tensor& dshort = shortcut_->empty() ? dsum_ : shortcut_->backward(dsum_, true);
  ensure(dx_, dmain.shape(), dmain.dtype());
  kernels::add(dmain.dtype(), dmain.raw(), dshort.raw(), dx_.raw(), dmain.numel(), ctx_.stream());
  return dx_;
}

// ---- the mirror of a host network ------------------------------------------------------------

namespace {

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
    seq_.add(std::make_unique<PoolGpu>(ctx_, PoolGpu::Kind::Max, Geometry::of(*in_), p.kernel(), p.stride(),
                                       p.padding()));
  }
  void visit(const GlobalAvgPool<float>&) override {
    seq_.add(std::make_unique<PoolGpu>(ctx_, PoolGpu::Kind::GlobalAverage, Geometry::of(*in_), 0, 0, 0));
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

}  // namespace

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

}  // namespace hpc::nn::cuda

#include "nn/cuda/context.hpp"

#include <vector>

#include "core/device.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "kernels/kernels.hpp"

namespace hpc::nn::cuda {

DType activation_type(Math math) {
  return math == Math::Bf16 ? DType::BF16 : math == Math::Fp16 ? DType::F16 : DType::F32;
}

cudnnDataType_t cudnn_type(DType t) {
  switch (t) {
    case DType::F32: return CUDNN_DATA_FLOAT;
    case DType::BF16: return CUDNN_DATA_BFLOAT16;
    case DType::F16: return CUDNN_DATA_HALF;
    default: break;
  }
  throw Error(ErrorKind::Internal, detail::concat("cuDNN takes no ", dtype_name(t), " activations here"));
}

GpuContext::GpuContext(GpuSettings settings)
    : settings_(settings), act_(activation_type(settings.math)), blas_(cublas::api()) {
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));  // see the header
  device::set_stream(stream_);
  CUBLAS_CHECK(blas_.Create(&cublas_));
  CUBLAS_CHECK(blas_.SetStream(cublas_, stream_));
  // A workspace of our own (set after the stream, which resets it), as PyTorch gives cuBLAS:
  // products captured in a CUDA graph then use it instead of allocating inside the graph.
  constexpr int64_t kCublasWorkspaceBytes = 32 << 20;
  cublas_workspace_ = Tensor(Shape{kCublasWorkspaceBytes / 4}, DType::F32, DeviceKind::CUDA);
  CUBLAS_CHECK(blas_.SetWorkspace(cublas_, cublas_workspace_.raw(), kCublasWorkspaceBytes));
  // Pointer mode host: alpha and beta are host scalars. Tensor cores only when asked; the
  // default math never uses TF32 in cuBLAS.
  // (bf16 and fp16 products use tensor cores whatever the mode and accumulate in fp32; cuBLAS
  // may add split-K partial sums in 16 bits, as PyTorch's default allows too.)
  CUBLAS_CHECK(blas_.SetMathMode(cublas_, settings_.math == Math::Tf32 ? CUBLAS_TF32_TENSOR_OP_MATH
                                                                      : CUBLAS_DEFAULT_MATH));
  CUDNN_CHECK(cudnnCreate(&cudnn_));
  CUDNN_CHECK(cudnnSetStream(cudnn_, stream_));
  flag_ = Tensor(Shape{1}, DType::I32, DeviceKind::CUDA);
}

GpuContext::~GpuContext() {
  // Never throws: a failure while tearing down after another error must not hide it.
  if (stream_) cudaStreamSynchronize(stream_);
  workspace_ = Tensor();
  ones_ = Tensor();
  ones_lp_ = Tensor();
  flag_ = Tensor();
  if (cudnn_) cudnnDestroy(cudnn_);
  if (cublas_) blas_.Destroy(cublas_);
  device::set_stream(nullptr);
  if (stream_) cudaStreamDestroy(stream_);
}

void* GpuContext::workspace(size_t bytes) {
  if (bytes == 0) return nullptr;
  const int64_t floats = static_cast<int64_t>((bytes + sizeof(float) - 1) / sizeof(float));
  if (!workspace_.defined() || workspace_.numel() < floats) workspace_ = Tensor(Shape{floats}, DType::F32, DeviceKind::CUDA);
  return workspace_.raw();
}

const float* GpuContext::ones(int64_t n) {
  if (!ones_.defined() || ones_.numel() < n) {
    ones_ = Tensor(Shape{n}, DType::F32, DeviceKind::CUDA);
    const std::vector<float> host(static_cast<size_t>(n), 1.0f);
    device::copy(ones_.raw(), host.data(), host.size() * sizeof(float), device::Copy::HostToDevice);
  }
  return ones_.data<float>();
}

const void* GpuContext::ones(int64_t n, DType t) {
  if (t == DType::F32) return ones(n);
  if (!ones_lp_.defined() || ones_lp_.dtype() != t || ones_lp_.numel() < n) {
    ones_lp_ = Tensor(Shape{n}, t, DeviceKind::CUDA);
    kernels::convert(DType::F32, ones(n), t, ones_lp_.raw(), n, 1.0f, nullptr, stream_);
  }
  return ones_lp_.raw();
}

DType GpuContext::norm_type() {
  if (act_ == DType::F32) return act_;
  if (norm_native_ < 0) {
    // Exactly the cuDNN calls the layers make in act_ (layers.cpp), on a 2x4x4x8 batch: batch
    // norm's statistics descriptor and inference; max pooling forward, unpadded (the 2x2 pool
    // fused into a batch norm) and padded (ResNet's 3x3 stem pool); the global average pool,
    // forward and backward. Batch-norm training and backward and max pooling's backward are
    // our kernels (kernels/), which take every act_. cuDNN checks the types on the host and
    // answers with a status; none of these throws.
    constexpr int64_t kC = 8, kHW = 4, kN = 2 * kHW * kHW * kC;
    const float one = 1.0f, zero = 0.0f;
    auto succeeds = [](cudnnStatus_t st) { return st == CUDNN_STATUS_SUCCESS; };
    TensorDesc x, stats, pooled, averaged;
    x.set_nhwc(2, kHW, kHW, kC, act_);
    pooled.set_nhwc(2, kHW / 2, kHW / 2, kC, act_);
    averaged.set_nhwc(2, 1, 1, kC, act_);
    Tensor a(Shape{kN}, act_, DeviceKind::CUDA), b(Shape{kN}, act_, DeviceKind::CUDA);
    Tensor c(Shape{kN}, act_, DeviceKind::CUDA), d(Shape{kN}, act_, DeviceKind::CUDA);
    Tensor f(Shape{4 * kC}, DType::F32, DeviceKind::CUDA);
    CUDA_CHECK(cudaMemsetAsync(a.raw(), 0, a.bytes(), stream_));
    CUDA_CHECK(cudaMemsetAsync(c.raw(), 0, c.bytes(), stream_));
    CUDA_CHECK(cudaMemsetAsync(f.raw(), 0, f.bytes(), stream_));
    float* p = f.data<float>();  // scale, bias, running mean, running variance
    bool ok = succeeds(cudnnDeriveBNTensorDescriptor(stats.get(), x.get(), CUDNN_BATCHNORM_SPATIAL));
    ok = ok && succeeds(cudnnBatchNormalizationForwardInference(cudnn_, CUDNN_BATCHNORM_SPATIAL, &one, &zero,
                                                                x.get(), a.raw(), x.get(), b.raw(), stats.get(), p,
                                                                p + kC, p + 2 * kC, p + 3 * kC, CUDNN_BN_MIN_EPSILON));
    struct Pool {
      cudnnPoolingMode_t mode;
      int window, pad, stride;
      const TensorDesc& out;
      bool backward;
    };
    for (const Pool& q : {Pool{CUDNN_POOLING_MAX_DETERMINISTIC, 2, 0, 2, pooled, false},
                          Pool{CUDNN_POOLING_MAX_DETERMINISTIC, 3, 1, 2, pooled, false},
                          Pool{CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING, kHW, 0, kHW, averaged, true}}) {
      PoolDesc pool;
      CUDNN_CHECK(cudnnCreatePoolingDescriptor(pool.out()));
      ok = ok && succeeds(cudnnSetPooling2dDescriptor(pool.get(), q.mode, CUDNN_PROPAGATE_NAN, q.window, q.window,
                                                      q.pad, q.pad, q.stride, q.stride));
      ok = ok && succeeds(cudnnPoolingForward(cudnn_, pool.get(), &one, x.get(), a.raw(), &zero, q.out.get(), b.raw()));
      ok = ok && (!q.backward || succeeds(cudnnPoolingBackward(cudnn_, pool.get(), &one, q.out.get(), b.raw(),
                                                               q.out.get(), c.raw(), x.get(), a.raw(), &zero,
                                                               x.get(), d.raw())));
    }
    // A refused call may leave its launch error behind: it is the probe's, not the next kernel's.
    if (!ok) (void)cudaGetLastError();
    synchronize();  // the probe's buffers go back to the allocator only when it is done
    norm_native_ = ok ? 1 : 0;
    if (!ok) {
      log::info("cuDNN ", cudnnGetVersion(), " takes no ", dtype_name(act_),
                " batch-norm inference or pooling: those layers compute in fp32 and convert at their ends");
    }
  }
  return norm_native_ ? act_ : DType::F32;
}

void GpuContext::synchronize() { CUDA_CHECK(cudaStreamSynchronize(stream_)); }

void ensure(Tensor& t, const Shape& shape, DType dtype) {
  if (!t.defined()) t = Tensor(shape, dtype, DeviceKind::CUDA);
  else t.resize(shape, dtype);
}

TensorDesc::TensorDesc() { CUDNN_CHECK(cudnnCreateTensorDescriptor(d_.out())); }

void TensorDesc::set_nhwc(int64_t n, int64_t h, int64_t w, int64_t c, DType t) {
  HPC_CHECK(n > 0 && h > 0 && w > 0 && c > 0 && h * w * c <= INT32_MAX, "tensor descriptor of ", n, "x", h, "x", w,
            "x", c);
  // cuDNN's descriptors count a tensor's elements in an int: a batch whose activation is
  // larger is the user's to make smaller (the cnn at 28x28 reaches it near 86,000 images).
  HPC_REQUIRE(n <= INT32_MAX / (h * w * c), "a batch of ", n, " images makes an activation of ", n, " x ", h, " x ",
              w, " x ", c, " elements, more than cuDNN's limit of 2^31 - 1 for one tensor: use a smaller "
              "--batch-size (or --eval-batch-size) per GPU");
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(d_.get(), CUDNN_TENSOR_NHWC, cudnn_type(t), static_cast<int>(n),
                                         static_cast<int>(c), static_cast<int>(h), static_cast<int>(w)));
}

}  // namespace hpc::nn::cuda

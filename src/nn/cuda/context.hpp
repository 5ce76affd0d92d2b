// What every GPU layer of one rank shares: the compute stream they all enqueue on, the cuBLAS
// and cuDNN handles bound to it, one workspace, a vector of ones (bias terms through cuBLAS),
// and the math settings. One per process, created after device::select_gpu; RAII.
//
// Stream contract: the compute stream is non-blocking (it neither waits for the legacy default
// stream nor makes it wait, as PyTorch's and llm.c's streams), and while the context lives it
// is device::set_stream's: device::zero behind every new Tensor (cudaMemsetAsync) and
// device::copy are enqueued on it. A buffer a layer frees and the allocator hands out again is
// therefore zeroed and written behind the kernels still reading it, and a memset during a CUDA
// graph's capture is captured. The NCCL communicator's stream is the only other one; it and
// this one wait on each other's events (train/engine/gpu_engine.cpp). One context per process.
#pragma once

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstdint>

#include "core/cublas.hpp"
#include "core/cuda_check.hpp"
#include "core/handle.hpp"
#include "core/tensor.hpp"

#define CUDNN_CHECK(expr) HPC_GPU_CHECK("cuDNN", expr, CUDNN_STATUS_SUCCESS, cudnnGetErrorString)

namespace hpc::nn::cuda {

// fp32: IEEE float everywhere (the parity tests against the CPU); tf32: convolutions and
// matrix products on tensor cores with 10-bit mantissas, as PyTorch's cuDNN default.
// bf16 / fp16: mixed precision, as PyTorch's autocast: activations and the weights' copies the
// convolutions and products read are 16-bit, the products accumulate in fp32 (cuBLAS may add
// split-K partial sums in 16 bits, as under autocast); master weights,
// gradients, batch-norm parameters and statistics, the loss and the optimizer stay fp32. fp16
// needs loss scaling (GpuContext::set_loss_scale); bf16 has fp32's range and needs none.
enum class Math { Fp32, Tf32, Bf16, Fp16 };

// The element type of activations under `math`: F32, BF16 or F16.
DType activation_type(Math math);
cudnnDataType_t cudnn_type(DType t);

struct GpuSettings {
  Math math = Math::Tf32;
  // Only algorithms that give the same bits every run (exact resume on the GPU).
  bool deterministic = true;
  // Largest workspace one convolution algorithm may use.
  size_t workspace_limit = size_t{1} << 30;
};

class GpuContext {
 public:
  explicit GpuContext(GpuSettings settings);
  ~GpuContext();
  GpuContext(const GpuContext&) = delete;
  GpuContext& operator=(const GpuContext&) = delete;

  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas() const { return cublas_; }
  // cuBLAS's entry points (loaded by the first context: core/cublas.hpp).
  const cublas::Api& blas() const { return blas_; }
  cudnnHandle_t cudnn() const { return cudnn_; }
  const GpuSettings& settings() const { return settings_; }
  // At least `bytes` of scratch, valid for work enqueued before the next call (one stream).
  void* workspace(size_t bytes);
  // n ones on the device.
  const float* ones(int64_t n);
  // n ones of type t (F32, BF16 or F16).
  const void* ones(int64_t n, DType t);
  void synchronize();

  // The activations' element type (activation_type of the settings' math).
  DType act() const { return act_; }
  // The element type batch norm and pooling compute in: act(), or F32 where one of the cuDNN
  // calls those layers make (batch-norm inference, max and average pooling) refuses act()
  // (bf16 in some versions); those layers then convert at their ends. Probed once, on a tiny
  // tensor, with exactly the calls and pool shapes the layers use.
  DType norm_type();
  // Loss scaling (fp16): the backward pass starts from the loss times `scale`; layers divide
  // it out of the parameter gradients they write (grad_factor() = 1 / scale). The device
  // flag non_finite() is where the step's check of the summed gradients reports a value that
  // is not finite. The scale is 1 in the other precisions.
  void set_loss_scale(float scale) { loss_scale_ = scale; }
  float loss_scale() const { return loss_scale_; }
  float grad_factor() const { return 1.0f / loss_scale_; }
  int* non_finite() { return static_cast<int*>(flag_.raw()); }

 private:
  GpuSettings settings_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  Tensor workspace_, ones_, ones_lp_, flag_;
  Tensor cublas_workspace_;  // cuBLAS's own, fixed: a captured CUDA graph then allocates nothing
  DType act_;
  const cublas::Api& blas_;
  int norm_native_ = -1;  // norm_type(): -1 not probed yet, 0 fp32, 1 act()
  float loss_scale_ = 1.0f;
};

// A device tensor of `shape` (and dtype), reusing t's storage when it is large enough (as
// Tensor::resize on the host).
void ensure(Tensor& t, const Shape& shape, DType dtype = DType::F32);

// cuDNN's descriptors, each destroyed with its owner (core/handle.hpp).
using FilterDesc = Handle<cudnnFilterDescriptor_t, cudnnDestroyFilterDescriptor>;
using ConvDesc = Handle<cudnnConvolutionDescriptor_t, cudnnDestroyConvolutionDescriptor>;
using PoolDesc = Handle<cudnnPoolingDescriptor_t, cudnnDestroyPoolingDescriptor>;

// A tensor descriptor, made with its owner.
class TensorDesc {
 public:
  TensorDesc();
  // n images of h x w x c elements of type t, channels last.
  void set_nhwc(int64_t n, int64_t h, int64_t w, int64_t c, DType t = DType::F32);
  cudnnTensorDescriptor_t get() const { return d_.get(); }

 private:
  Handle<cudnnTensorDescriptor_t, cudnnDestroyTensorDescriptor> d_;
};

}  // namespace hpc::nn::cuda

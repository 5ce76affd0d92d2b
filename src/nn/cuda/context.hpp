// What every GPU layer of one rank shares: the compute stream they all enqueue on, the cuBLAS
// and cuDNN handles bound to it, one workspace, a vector of ones (bias sums through cuBLAS),
// and the math settings. One per process, created after device::select_gpu; RAII.
//
// Stream contract: the compute stream is a blocking stream, so the legacy default stream's
// synchronous calls (device::copy, device::zero behind every new Tensor) wait for it and it
// waits for them. A buffer a layer frees and the allocator hands out again therefore never
// races with kernels still reading it. The NCCL communicator's stream is the only other one;
// it waits on events recorded here (train/gpu_engine.cpp).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstdint>

#include "core/cuda_check.hpp"
#include "core/tensor.hpp"

#define CUDNN_CHECK(expr) HPC_GPU_CHECK("cuDNN", expr, CUDNN_STATUS_SUCCESS, cudnnGetErrorString)

namespace hpc::nn::cuda {

// fp32: IEEE float everywhere (the parity tests against the CPU); tf32: convolutions and
// matrix products on tensor cores with 10-bit mantissas, as PyTorch's cuDNN default.
enum class Math { Fp32, Tf32 };

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
  cudnnHandle_t cudnn() const { return cudnn_; }
  const GpuSettings& settings() const { return settings_; }
  // At least `bytes` of scratch, valid for work enqueued before the next call (one stream).
  void* workspace(size_t bytes);
  // n ones on the device.
  const float* ones(int64_t n);
  void synchronize();

 private:
  GpuSettings settings_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  Tensor workspace_, ones_;
};

// A device tensor of `shape`, reusing t's storage when it is large enough (as Tensor::resize
// on the host).
void ensure(Tensor& t, const Shape& shape);

// RAII for cuDNN descriptors.
class TensorDesc {
 public:
  TensorDesc();
  ~TensorDesc();
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
  // n images of h x w x c floats, channels last.
  void set_nhwc(int64_t n, int64_t h, int64_t w, int64_t c);
  cudnnTensorDescriptor_t get() const { return d_; }

 private:
  cudnnTensorDescriptor_t d_ = nullptr;
};

}  // namespace hpc::nn::cuda

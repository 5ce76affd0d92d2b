#include "nn/cuda/context.hpp"

#include <vector>

#include "core/error.hpp"

namespace hpc::nn::cuda {

GpuContext::GpuContext(GpuSettings settings) : settings_(settings) {
  CUDA_CHECK(cudaStreamCreate(&stream_));  // blocking: see the header
  CUBLAS_CHECK(cublasCreate(&cublas_));
  CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
  // Pointer mode host: alpha and beta are host scalars. Tensor cores only when asked; the
  // default math never uses TF32 in cuBLAS.
  CUBLAS_CHECK(cublasSetMathMode(cublas_, settings_.math == Math::Tf32 ? CUBLAS_TF32_TENSOR_OP_MATH
                                                                        : CUBLAS_DEFAULT_MATH));
  CUDNN_CHECK(cudnnCreate(&cudnn_));
  CUDNN_CHECK(cudnnSetStream(cudnn_, stream_));
}

GpuContext::~GpuContext() {
  // Never throws: a failure while tearing down after another error must not hide it.
  if (stream_) cudaStreamSynchronize(stream_);
  workspace_ = Tensor();
  ones_ = Tensor();
  if (cudnn_) cudnnDestroy(cudnn_);
  if (cublas_) cublasDestroy(cublas_);
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
    CUDA_CHECK(cudaMemcpy(ones_.raw(), host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
  return ones_.data<float>();
}

void GpuContext::synchronize() { CUDA_CHECK(cudaStreamSynchronize(stream_)); }

void ensure(Tensor& t, const Shape& shape) {
  if (!t.defined()) t = Tensor(shape, DType::F32, DeviceKind::CUDA);
  else t.resize(shape, DType::F32);
}

TensorDesc::TensorDesc() { CUDNN_CHECK(cudnnCreateTensorDescriptor(&d_)); }
TensorDesc::~TensorDesc() { cudnnDestroyTensorDescriptor(d_); }

void TensorDesc::set_nhwc(int64_t n, int64_t h, int64_t w, int64_t c) {
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(d_, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, static_cast<int>(n),
                                         static_cast<int>(c), static_cast<int>(h), static_cast<int>(w)));
}

}  // namespace hpc::nn::cuda

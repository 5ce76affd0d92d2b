#include "core/cuda_check.hpp"
#include "core/error.hpp"
#include "kernels/kernels.hpp"
#include "kernels/launch.cuh"
#include "kernels/types.cuh"

namespace hpc::kernels {
namespace {

template <class T>
__global__ void relu_forward_kernel(const T* x, T* y, int64_t n) {
  HPC_GRID_STRIDE(i, n) {
    const float v = to_f(x[i]);
    y[i] = from_f<T>(v > 0.f ? v : 0.f);
  }
}

template <class T>
__global__ void relu_backward_kernel(const T* y, const T* dy, T* dx, int64_t n) {
  HPC_GRID_STRIDE(i, n) dx[i] = to_f(y[i]) > 0.f ? dy[i] : from_f<T>(0.f);
}

template <class T>
__global__ void add_kernel(const T* a, const T* b, T* out, int64_t n) {
  HPC_GRID_STRIDE(i, n) out[i] = from_f<T>(to_f(a[i]) + to_f(b[i]));
}

template <class From, class To>
__global__ void convert_kernel(const From* in, To* out, int64_t n, float factor, int* non_finite) {
  bool bad = false;
  HPC_GRID_STRIDE(i, n) {
    const To v = from_f<To>(to_f(in[i]) * factor);
    out[i] = v;
    bad |= !isfinite(to_f(v));
  }
  if (non_finite && __syncthreads_or(bad) && threadIdx.x == 0) *non_finite = 1;  // every writer writes 1
}

__global__ void normalize_u8_kernel(const uint8_t* in, float* out, int64_t n, int channels, const float* table) {
  HPC_GRID_STRIDE(i, n) out[i] = table[(i % channels) * 256 + in[i]];
}

__global__ void crop_flip_normalize_u8_kernel(const uint8_t* in, const int32_t* crops, float* out, int64_t total,
                                              int64_t h, int64_t w, int channels, const float* table) {
  HPC_GRID_STRIDE(i, total) {
    const int ch = static_cast<int>(i % channels);
    const int64_t pixel = i / channels, x = pixel % w, y = (pixel / w) % h, image = pixel / (w * h);
    const int32_t* cf = crops + 3 * image;
    const int64_t sy = y + cf[0], sx = (cf[2] ? w - 1 - x : x) + cf[1];
    const bool inside = sy >= 0 && sy < h && sx >= 0 && sx < w;
    const uint8_t v = inside ? in[((image * h + sy) * w + sx) * channels + ch] : uint8_t{0};
    out[i] = table[ch * 256 + v];
  }
}

}  // namespace

void relu_forward(DType t, const void* x, void* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  with_type(t, [&](auto tag) {
    using T = decltype(tag);
    relu_forward_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(y), n);
  });
  CUDA_CHECK_LAUNCH();
}

void relu_backward(DType t, const void* y, const void* dy, void* dx, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  with_type(t, [&](auto tag) {
    using T = decltype(tag);
    relu_backward_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const T*>(y), static_cast<const T*>(dy),
                                                                    static_cast<T*>(dx), n);
  });
  CUDA_CHECK_LAUNCH();
}

void add(DType t, const void* a, const void* b, void* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  with_type(t, [&](auto tag) {
    using T = decltype(tag);
    add_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const T*>(a), static_cast<const T*>(b),
                                                          static_cast<T*>(out), n);
  });
  CUDA_CHECK_LAUNCH();
}

void convert(DType from, const void* in, DType to, void* out, int64_t n, float factor, int* non_finite,
             cudaStream_t stream) {
  if (n == 0) return;
  with_type(from, [&](auto from_tag) {
    with_type(to, [&](auto to_tag) {
      using From = decltype(from_tag);
      using To = decltype(to_tag);
      convert_kernel<From, To><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const From*>(in),
                                                                       static_cast<To*>(out), n, factor, non_finite);
    });
  });
  CUDA_CHECK_LAUNCH();
}

void relu_forward(const float* x, float* y, int64_t n, cudaStream_t stream) {
  relu_forward(DType::F32, x, y, n, stream);
}

void relu_backward(const float* y, const float* dy, float* dx, int64_t n, cudaStream_t stream) {
  relu_backward(DType::F32, y, dy, dx, n, stream);
}

void add(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {
  add(DType::F32, a, b, out, n, stream);
}

void normalize_u8(const uint8_t* in, float* out, int64_t n, int channels, const float* table, cudaStream_t stream) {
  if (n == 0) return;
  normalize_u8_kernel<<<blocks_for(n), kThreads, 0, stream>>>(in, out, n, channels, table);
  CUDA_CHECK_LAUNCH();
}

void crop_flip_normalize_u8(const uint8_t* in, const int32_t* crops, float* out, int64_t n, int64_t h, int64_t w,
                            int channels, const float* table, cudaStream_t stream) {
  const int64_t total = n * h * w * channels;
  if (total == 0) return;
  crop_flip_normalize_u8_kernel<<<blocks_for(total), kThreads, 0, stream>>>(in, crops, out, total, h, w, channels,
                                                                            table);
  CUDA_CHECK_LAUNCH();
}

void scale_and_check(float* x, int64_t n, float factor, int* non_finite, cudaStream_t stream) {
  convert(DType::F32, x, DType::F32, x, n, factor, non_finite, stream);
}

}  // namespace hpc::kernels

// Batch norm in training, NHWC (nn::BatchNorm's CPU layer is the reference: network_test and
// kernels_test). cuDNN's legacy batch-norm calls ran NCHW kernels on our NHWC tensors and took
// 88% of a ResNet-50 step on an H200 (bench/README.md); these read the channels-innermost
// layout directly. Every per-channel sum is taken in double over fixed slabs of rows, and the
// slabs are added in a fixed order: the same bits on every run, whatever the GPU.
#include <algorithm>

#include "core/cuda_check.hpp"
#include "kernels/kernels.hpp"
#include "kernels/launch.cuh"
#include "kernels/types.cuh"

namespace hpc::kernels {
namespace {

constexpr int kLanes = 32;      // channels per block: a warp reads 32 neighbouring channels of a row
constexpr int kRowLanes = 8;    // rows a block reads at once
constexpr int64_t kMaxSlabs = 256;
constexpr int kCoefficients = 4;  // per channel, for the elementwise pass (see the finalize kernels)

int64_t slabs_for(int64_t rows) { return std::clamp<int64_t>((rows + 63) / 64, 1, kMaxSlabs); }

// partial[slab][0][c] and partial[slab][1][c]: over the slab's rows, the sums of x and x^2
// (forward), or of dy and dy (x - mean[c]) (backward).
template <class T, bool kBackward>
__global__ void partial_sums_kernel(const T* x, const T* dy, const float* mean, int64_t rows, int channels,
                                    int64_t rows_per_slab, double* partial) {
  __shared__ double s0[kRowLanes][kLanes], s1[kRowLanes][kLanes];
  const int c = blockIdx.x * kLanes + threadIdx.x;
  const int64_t slab = blockIdx.y, begin = slab * rows_per_slab;
  const int64_t end = begin + rows_per_slab < rows ? begin + rows_per_slab : rows;
  double a = 0, b = 0;
  if (c < channels) {
    const double m = kBackward ? mean[c] : 0.0;
#pragma unroll 4
    for (int64_t r = begin + threadIdx.y; r < end; r += kRowLanes) {
      const double v = to_f(x[r * channels + c]);
      if (kBackward) {
        const double g = to_f(dy[r * channels + c]);
        a += g;
        b += g * (v - m);
      } else {
        a += v;
        b += v * v;
      }
    }
  }
  s0[threadIdx.y][threadIdx.x] = a;
  s1[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0 && c < channels) {
    for (int k = 1; k < kRowLanes; ++k) a += s0[k][threadIdx.x], b += s1[k][threadIdx.x];
    partial[(slab * 2) * channels + c] = a;
    partial[(slab * 2 + 1) * channels + c] = b;
  }
}

// The slabs' sums of channel c, added in a fixed order: lane y of the block takes slabs y,
// y + 8, ..., then lane 0 adds the lanes in order. Every thread of the block must call it.
__device__ void total_of(const double* partial, int64_t slabs, int channels, int c, double& a, double& b) {
  __shared__ double s0[kRowLanes][kLanes], s1[kRowLanes][kLanes];
  a = 0, b = 0;
  if (c < channels)
    for (int64_t s = threadIdx.y; s < slabs; s += kRowLanes)
      a += partial[(s * 2) * channels + c], b += partial[(s * 2 + 1) * channels + c];
  s0[threadIdx.y][threadIdx.x] = a;
  s1[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0)
    for (int k = 1; k < kRowLanes; ++k) a += s0[k][threadIdx.x], b += s1[k][threadIdx.x];
}

// Forward: the statistics, the running averages, and for the elementwise pass (mean, scale,
// shift): y = (x - mean) * scale + shift with scale = gamma * invstd, shift = beta.
__global__ void forward_finalize_kernel(const double* partial, int64_t slabs, int64_t rows, int channels,
                                        const float* gamma, const float* beta, float* running_mean,
                                        float* running_var, double momentum, double eps, float* save_mean,
                                        float* save_invstd, float* coef) {
  const int c = blockIdx.x * kLanes + threadIdx.x;
  double sum, squares;
  total_of(partial, slabs, channels, c, sum, squares);
  if (threadIdx.y != 0 || c >= channels) return;
  const double n = static_cast<double>(rows), mean = sum / n;
  const double var = fmax(squares / n - mean * mean, 0.0);  // biased: the one that normalises
  const double invstd = 1.0 / sqrt(var + eps);
  save_mean[c] = static_cast<float>(mean);
  save_invstd[c] = static_cast<float>(invstd);
  running_mean[c] = static_cast<float>((1 - momentum) * running_mean[c] + momentum * mean);
  running_var[c] = static_cast<float>((1 - momentum) * running_var[c] + momentum * var * n / (n - 1));
  float* k = coef + kCoefficients * c;
  k[0] = static_cast<float>(mean);
  k[1] = static_cast<float>(gamma[c] * invstd);
  k[2] = beta[c];
}

// Backward: dgamma = factor sum dy xhat, dbeta = factor sum dy, and for the elementwise pass
// (mean, a, k, b): dx = a dy + k (x - mean) + b, which is
// gamma invstd (dy - mean(dy) - xhat mean(dy xhat)) with xhat = (x - mean) invstd.
__global__ void backward_finalize_kernel(const double* partial, int64_t slabs, int64_t rows, int channels,
                                         const float* gamma, const float* save_mean, const float* save_invstd,
                                         float param_factor, float* dgamma, float* dbeta, float* coef) {
  const int c = blockIdx.x * kLanes + threadIdx.x;
  double sum_dy, sum_dy_centred;
  total_of(partial, slabs, channels, c, sum_dy, sum_dy_centred);
  if (threadIdx.y != 0 || c >= channels) return;
  const double n = static_cast<double>(rows), invstd = save_invstd[c], g = gamma[c];
  const double sum_dy_xhat = sum_dy_centred * invstd;
  dbeta[c] = static_cast<float>(param_factor * sum_dy);
  dgamma[c] = static_cast<float>(param_factor * sum_dy_xhat);
  float* k = coef + kCoefficients * c;
  k[0] = save_mean[c];
  k[1] = static_cast<float>(g * invstd);
  k[2] = static_cast<float>(-g * invstd * invstd * sum_dy_xhat / n);
  k[3] = static_cast<float>(-g * invstd * sum_dy / n);
}

template <class T>
__global__ void forward_apply_kernel(const T* x, T* y, int64_t n, int channels, const float* coef, bool relu) {
  HPC_GRID_STRIDE(i, n) {
    const float* k = coef + kCoefficients * static_cast<int>(i % channels);
    float v = (to_f(x[i]) - k[0]) * k[1] + k[2];
    if (relu) v = v > 0.f ? v : 0.f;
    y[i] = from_f<T>(v);
  }
}

template <class T>
__global__ void backward_apply_kernel(const T* x, const T* dy, T* dx, int64_t n, int channels, const float* coef) {
  HPC_GRID_STRIDE(i, n) {
    const float* k = coef + kCoefficients * static_cast<int>(i % channels);
    dx[i] = from_f<T>(k[1] * to_f(dy[i]) + k[2] * (to_f(x[i]) - k[0]) + k[3]);
  }
}

// One call's plan: its slabs of rows, its grids, and the parts of its work area (the slabs'
// partial sums in double, then the per-channel coefficients in float).
struct Plan {
  Plan(void* work, int64_t rows, int64_t channels)
      : slabs(slabs_for(rows)),
        per_slab((rows + slabs - 1) / slabs),
        c(static_cast<int>(channels)),
        partial(static_cast<double*>(work)),
        coef(reinterpret_cast<float*>(partial + slabs * 2 * channels)) {
    HPC_CHECK(rows > 1 && channels > 0 && channels <= INT32_MAX / kCoefficients,
              "batch norm of ", rows, " rows x ", channels, " channels");
  }
  unsigned channel_blocks() const { return static_cast<unsigned>((c + kLanes - 1) / kLanes); }
  dim3 sums_grid() const { return dim3(channel_blocks(), static_cast<unsigned>(slabs)); }
  dim3 finalize_grid() const { return dim3(channel_blocks()); }
  static dim3 block() { return dim3(kLanes, kRowLanes); }

  int64_t slabs, per_slab;
  int c;
  double* partial;
  float* coef;
};

}  // namespace

size_t batch_norm_work_bytes(int64_t rows, int64_t channels) {
  return static_cast<size_t>(slabs_for(rows) * 2 * channels) * sizeof(double) +
         static_cast<size_t>(kCoefficients * channels) * sizeof(float);
}

void batch_norm_forward_train(DType t, const void* x, void* y, int64_t rows, int64_t channels, const float* gamma,
                              const float* beta, float* running_mean, float* running_var, double momentum,
                              double eps, bool relu, float* save_mean, float* save_invstd, void* work,
                              cudaStream_t stream) {
  const Plan p(work, rows, channels);
  with_type(t, [&](auto tag) {
    using T = decltype(tag);
    partial_sums_kernel<T, false><<<p.sums_grid(), Plan::block(), 0, stream>>>(
        static_cast<const T*>(x), nullptr, nullptr, rows, p.c, p.per_slab, p.partial);
    CUDA_CHECK_LAUNCH();
    forward_finalize_kernel<<<p.finalize_grid(), Plan::block(), 0, stream>>>(
        p.partial, p.slabs, rows, p.c, gamma, beta, running_mean, running_var, momentum, eps, save_mean, save_invstd,
        p.coef);
    CUDA_CHECK_LAUNCH();
    const int64_t n = rows * channels;
    forward_apply_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(y), n,
                                                                   p.c, p.coef, relu);
  });
  CUDA_CHECK_LAUNCH();
}

void batch_norm_backward(DType t, const void* x, const void* dy, void* dx, int64_t rows, int64_t channels,
                         const float* gamma, const float* save_mean, const float* save_invstd, float param_factor,
                         float* dgamma, float* dbeta, void* work, cudaStream_t stream) {
  const Plan p(work, rows, channels);
  with_type(t, [&](auto tag) {
    using T = decltype(tag);
    partial_sums_kernel<T, true><<<p.sums_grid(), Plan::block(), 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(dy), save_mean, rows, p.c, p.per_slab, p.partial);
    CUDA_CHECK_LAUNCH();
    backward_finalize_kernel<<<p.finalize_grid(), Plan::block(), 0, stream>>>(
        p.partial, p.slabs, rows, p.c, gamma, save_mean, save_invstd, param_factor, dgamma, dbeta, p.coef);
    CUDA_CHECK_LAUNCH();
    const int64_t n = rows * channels;
    backward_apply_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<T*>(dx), n, p.c, p.coef);
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace hpc::kernels

#include <cmath>

#include "core/cuda_check.hpp"
#include "kernels/kernels.hpp"
#include "kernels/launch.cuh"

namespace hpc::kernels {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;

template <class T>
__device__ T warp_max(T v) {
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

template <class T>
__device__ T warp_sum(T v) {  // butterfly: every lane ends with the same sum, in a fixed order
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

// One warp per row. The arithmetic follows nn::SoftmaxCrossEntropy<float>: exponentials and
// sums in double, probabilities rounded to float, the gradient from the rounded probabilities.
__global__ void softmax_xent_kernel(const float* z, const int32_t* labels, int64_t n, int64_t k, float smoothing,
                                    float* prob, float* dz, float* row_loss) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = blockDim.x / 32;
  const double s = smoothing, off = s / static_cast<double>(k), on = 1 - s + off, inv_n = 1.0 / static_cast<double>(n);
  for (int64_t r = blockIdx.x * warps + threadIdx.x / 32; r < n; r += static_cast<int64_t>(gridDim.x) * warps) {
    const float* zr = z + r * k;
    float* pr = prob + r * k;
    float* dr = dz + r * k;
    float mx = -INFINITY;
    for (int64_t j = lane; j < k; j += 32) mx = fmaxf(mx, zr[j]);
    mx = warp_max(mx);
    double sum = 0, sum_z = 0;
    for (int64_t j = lane; j < k; j += 32) {
      const float e = static_cast<float>(exp(static_cast<double>(zr[j] - mx)));
      pr[j] = e;
      sum += e;
      sum_z += zr[j];
    }
    sum = warp_sum(sum);
    sum_z = warp_sum(sum_z);
    const double log_sum = log(sum) + mx;
    const int32_t y = labels[r];
    const bool valid = y >= 0 && y < k;
    for (int64_t j = lane; j < k; j += 32) {
      const float p = static_cast<float>(pr[j] / sum);
      pr[j] = p;
      dr[j] = valid ? static_cast<float>((p - (j == y ? on : off)) * inv_n) : 0.f;
    }
    if (lane == 0) {
      // -sum_j target_j log p_j = (1 - s)(log_sum - z_y) - s mean_j(z_j - log_sum)
      double loss = valid ? (1 - s) * (log_sum - zr[y]) : NAN;
      if (valid && s > 0) loss -= s * (sum_z / static_cast<double>(k) - log_sum);
      row_loss[r] = static_cast<float>(loss);
    }
  }
}

constexpr int kSumThreads = 1024;

__global__ void sum_kernel(const float* x, int64_t n, double* out) {
  __shared__ double part[kSumThreads];
  double acc = 0;
  for (int64_t i = threadIdx.x; i < n; i += kSumThreads) acc += x[i];
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int width = kSumThreads / 2; width > 0; width >>= 1) {
    if (threadIdx.x < width) part[threadIdx.x] += part[threadIdx.x + width];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = part[0];
}

// One thread per row: the first largest score, as std::max_element on the CPU.
__global__ void count_correct_kernel(const float* scores, const int32_t* labels, int64_t n, int64_t k, int* correct) {
  HPC_GRID_STRIDE(r, n) {
    const float* row = scores + r * k;
    int64_t best = 0;
    for (int64_t j = 1; j < k; ++j)
      if (row[j] > row[best]) best = j;
    if (best == labels[r]) atomicAdd(correct, 1);  // integer sums do not depend on the order
  }
}

}  // namespace

void softmax_xent(const float* logits, const int32_t* labels, int64_t n, int64_t k, float smoothing,
                  float* probabilities, float* dlogits, float* row_loss, cudaStream_t stream) {
  if (n == 0) return;
  const int64_t rows_per_block = kThreads / 32;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + rows_per_block - 1) / rows_per_block, 65535));
  softmax_xent_kernel<<<blocks, kThreads, 0, stream>>>(logits, labels, n, k, smoothing, probabilities, dlogits,
                                                       row_loss);
  CUDA_CHECK_LAUNCH();
}

void sum_deterministic(const float* x, int64_t n, double* out, cudaStream_t stream) {
  sum_kernel<<<1, kSumThreads, 0, stream>>>(x, n, out);
  CUDA_CHECK_LAUNCH();
}

void count_correct(const float* scores, const int32_t* labels, int64_t n, int64_t k, int* correct,
                   cudaStream_t stream) {
  if (n == 0) return;
  count_correct_kernel<<<blocks_for(n), kThreads, 0, stream>>>(scores, labels, n, k, correct);
  CUDA_CHECK_LAUNCH();
}

}  // namespace hpc::kernels

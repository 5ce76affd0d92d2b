#include "core/cuda_check.hpp"
#include "kernels/kernels.hpp"
#include "kernels/launch.cuh"

namespace hpc::kernels {
namespace {

// Index of the range holding element i: the first whose end is past i (binary search over a
// table of a few hundred entries at most, which stays in the L1 cache).
__device__ int range_of(int64_t i, const int64_t* end, int ranges) {
  int lo = 0, hi = ranges - 1;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (end[mid] > i) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

// a * b + c rounded as the CPU's optim::Sgd rounds it (`fused`: sgd_fuses_multiply_add()): once
// (__fmaf_rn) or twice (__fmul_rn, __fadd_rn, which nvcc never contracts), so that a step equals
// the CPU's bit for bit.
__device__ __forceinline__ float muladd(float a, float b, float c, bool fused) {
  return fused ? __fmaf_rn(a, b, c) : __fadd_rn(__fmul_rn(a, b), c);
}

__global__ void sgd_kernel(float* p, const float* g, float* v, int64_t n, const int64_t* end, const float* decay,
                           int ranges, float lr, float mu, bool nesterov, bool fused, const int* skip,
                           const float* hyper) {
  if (skip && *skip) return;
  if (hyper) {  // a replayed graph: this step's values, uploaded before the launch
    lr = hyper[0];
    mu = hyper[1];
  }
  HPC_GRID_STRIDE(i, n) {
    const float wd = decay[range_of(i, end, ranges)];
    const float gi = muladd(wd, p[i], g[i], fused);
    const float vi = muladd(mu, v[i], gi, fused);
    v[i] = vi;
    const float step = nesterov ? muladd(mu, vi, gi, fused) : vi;
    p[i] = muladd(-lr, step, p[i], fused);
  }
}

}  // namespace

void sgd_step(float* params, const float* grads, float* velocity, int64_t n, const int64_t* range_end,
              const float* range_decay, int ranges, float lr, float momentum, bool nesterov, bool fused,
              cudaStream_t stream, const int* skip, const float* hyper) {
  if (n == 0) return;
  sgd_kernel<<<blocks_for(n), kThreads, 0, stream>>>(params, grads, velocity, n, range_end, range_decay, ranges, lr,
                                                     momentum, nesterov, fused, skip, hyper);
  CUDA_CHECK_LAUNCH();
}

}  // namespace hpc::kernels

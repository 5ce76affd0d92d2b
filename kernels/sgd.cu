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

// __fmul_rn / __fadd_rn / __fsub_rn: the CPU build does not contract a * b + c into a fused
// multiply-add (GCC with -std=c++20 keeps -ffp-contract=off), so neither may this kernel if a
// step is to equal the CPU's bit for bit.
__global__ void sgd_kernel(float* p, const float* g, float* v, int64_t n, const int64_t* end, const float* decay,
                           int ranges, float lr, float mu, bool nesterov, const int* skip, const float* hyper) {
  if (skip && *skip) return;
  if (hyper) {  // a replayed graph: this step's values, uploaded before the launch
    lr = hyper[0];
    mu = hyper[1];
  }
  HPC_GRID_STRIDE(i, n) {
    const float wd = decay[range_of(i, end, ranges)];
    const float gi = __fadd_rn(g[i], __fmul_rn(wd, p[i]));
    const float vi = __fadd_rn(__fmul_rn(mu, v[i]), gi);
    v[i] = vi;
    const float step = nesterov ? __fadd_rn(gi, __fmul_rn(mu, vi)) : vi;
    p[i] = __fsub_rn(p[i], __fmul_rn(lr, step));
  }
}

}  // namespace

void sgd_step(float* params, const float* grads, float* velocity, int64_t n, const int64_t* range_end,
              const float* range_decay, int ranges, float lr, float momentum, bool nesterov, cudaStream_t stream,
              const int* skip, const float* hyper) {
  if (n == 0) return;
  sgd_kernel<<<blocks_for(n), kThreads, 0, stream>>>(params, grads, velocity, n, range_end, range_decay, ranges, lr,
                                                     momentum, nesterov, skip, hyper);
  CUDA_CHECK_LAUNCH();
}

}  // namespace hpc::kernels

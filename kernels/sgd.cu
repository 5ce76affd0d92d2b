#include "core/cuda_check.hpp"
#include "kernels/kernels.hpp"
#include "kernels/index_walk.hpp"
#include "kernels/launch.cuh"
#include "kernels/types.cuh"

namespace hpc::kernels {
namespace {

// a * b + c rounded as the CPU's optim::Sgd rounds it (`fused`: sgd_fuses_multiply_add()): once
// (__fmaf_rn) or twice (__fmul_rn, __fadd_rn, which nvcc never contracts), so that a step equals
// the CPU's bit for bit.
__device__ __forceinline__ float muladd(float a, float b, float c, bool fused) {
  return fused ? __fmaf_rn(a, b, c) : __fadd_rn(__fmul_rn(a, b), c);
}

// V neighbouring elements a thread (one 128-bit load of each array when V = 4), the range looked
// up once for the first of them: a pack may straddle a range's end, so each further element moves
// on past the ends it has reached, and every element gets range_of's decay. The arithmetic is the
// one-by-one kernel's (V = 1), element by element.
template <int V>
__global__ void sgd_kernel(float* p, const float* g, float* v, int64_t packs, const int64_t* end,
                           const float* decay, int ranges, float lr, float mu, bool nesterov, bool fused,
                           const int* skip, const float* hyper) {
  if (skip && *skip) return;
  if (hyper) {  // a replayed graph: this step's values, uploaded before the launch
    lr = hyper[0];
    mu = hyper[1];
  }
  using P = Pack<float, V>;
  HPC_GRID_STRIDE(k, packs) {
    const int64_t first = k * V;
    int r = range_of(first, end, ranges);
    P pk = reinterpret_cast<const P*>(p)[k], vk = reinterpret_cast<const P*>(v)[k];
    const P gk = reinterpret_cast<const P*>(g)[k];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      r = range_after(r, first + j, end, ranges);
      const float gi = muladd(decay[r], pk.v[j], gk.v[j], fused);
      const float vi = muladd(mu, vk.v[j], gi, fused);
      vk.v[j] = vi;
      const float step = nesterov ? muladd(mu, vi, gi, fused) : vi;
      pk.v[j] = muladd(-lr, step, pk.v[j], fused);
    }
    reinterpret_cast<P*>(v)[k] = vk;
    reinterpret_cast<P*>(p)[k] = pk;
  }
}

}  // namespace

void sgd_step(float* params, const float* grads, float* velocity, int64_t n, const int64_t* range_end,
              const float* range_decay, int ranges, float lr, float momentum, bool nesterov, bool fused,
              cudaStream_t stream, const int* skip, const float* hyper) {
  if (n == 0) return;
  with_width<float>(pack_width<float>(n, {params, grads, velocity}), [&](auto width) {
    constexpr int V = decltype(width)::value;
    sgd_kernel<V><<<blocks_for(n / V), kThreads, 0, stream>>>(params, grads, velocity, n / V, range_end, range_decay,
                                                             ranges, lr, momentum, nesterov, fused, skip, hyper);
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace hpc::kernels

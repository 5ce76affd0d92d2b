// Per-channel sums of a channels-last tensor (rows = N*H*W, channels innermost): the bias
// gradient of a convolution or linear layer, the sum of dy over its rows (nn::Conv2d's and
// nn::Linear's CPU backward are the reference: network_test; the sum in double: kernels_test).
// cuDNN's cudnnConvolutionBackwardBias took 47% of the cnn's step on an H200, at 36 GB/s.
// As in batch_norm.cu the sums are taken in double over fixed slabs of rows, and the slabs are
// added in a fixed order: the same bits on every run, whatever the GPU.
#include <algorithm>
#include <cstdint>

#include "core/cuda_check.hpp"
#include "kernels/kernels.hpp"
#include "kernels/launch.cuh"
#include "kernels/types.cuh"

namespace hpc::kernels {
namespace {

constexpr int kBlockChannels = 128;    // channels one block of the slab pass covers
constexpr int64_t kSlabElements = 8192;  // per block: eight 16-byte loads a thread in fp32, four in 16 bits
constexpr int64_t kMaxBlocks = 2048;   // enough to fill 132 SMs several times; bounds the partials
constexpr int kTotalLanes = 32;        // the total pass: lanes of slabs per channel (and channels per block)

// The slabs of one call, from the shape alone (channel_sums_work_bytes sizes their partials).
struct Plan {
  Plan(int64_t rows, int64_t channels) : rows(rows), channels(channels) {
    HPC_CHECK(rows > 0 && channels > 0, "channel sums of ", rows, " rows x ", channels, " channels");
    channel_blocks = (channels + kBlockChannels - 1) / kBlockChannels;
    // A slab: about kSlabElements of a block's elements (many rows of a narrow tensor).
    const int64_t wanted = (rows * std::min<int64_t>(channels, kBlockChannels) + kSlabElements - 1) / kSlabElements;
    const int64_t most = std::max<int64_t>(1, kMaxBlocks / channel_blocks);
    const int64_t count = std::clamp<int64_t>(wanted, 1, most);
    per_slab = (rows + count - 1) / count;
    slabs = (rows + per_slab - 1) / per_slab;  // none empty
  }
  int64_t rows, channels, channel_blocks, per_slab, slabs;
};

// partial[slab * channels + c] = the sum of x[r][c] over the slab's rows, in double. Thread
// (tx, ty) of block (bx, slab) takes channels c0 .. c0 + V - 1, c0 = bx * kBlockChannels + tx * V,
// in rows begin + ty, begin + ty + blockDim.y, ...: the block's threads read whole rows, so a
// warp reads 512 contiguous bytes (several rows of a tensor of 32 or 64 channels). The row
// lanes are then added in a fixed tree.
template <class T, int V>
__global__ void __launch_bounds__(kThreads) slab_sums_kernel(const T* __restrict__ x, int64_t rows, int64_t channels,
                                                              int64_t per_slab, double* __restrict__ partial) {
  __shared__ double lanes[kThreads * V];
  const int64_t c0 = blockIdx.x * int64_t{kBlockChannels} + threadIdx.x * V;
  const int64_t begin = blockIdx.y * per_slab, end = begin + per_slab < rows ? begin + per_slab : rows;
  double s[V] = {};
  if (c0 < channels) {
#pragma unroll 4
    for (int64_t r = begin + threadIdx.y; r < end; r += blockDim.y) {
      const Pack<T, V> p = *reinterpret_cast<const Pack<T, V>*>(x + r * channels + c0);
#pragma unroll
      for (int k = 0; k < V; ++k) s[k] += to_f(p.v[k]);
    }
  }
  double* mine = lanes + (threadIdx.y * blockDim.x + threadIdx.x) * V;
#pragma unroll
  for (int k = 0; k < V; ++k) mine[k] = s[k];
  __syncthreads();
  // Lane y adds lane y + half, for half = the largest power of two below blockDim.y, then half
  // of that, ...: a fixed order. Every thread takes part in every __syncthreads.
  unsigned half = 1;
  while (half < blockDim.y) half *= 2;
  for (half /= 2; half > 0; half /= 2) {
    if (threadIdx.y < half && threadIdx.y + half < blockDim.y) {
      const double* other = mine + half * blockDim.x * V;
#pragma unroll
      for (int k = 0; k < V; ++k) mine[k] = s[k] += other[k];
    }
    __syncthreads();
  }
  if (threadIdx.y == 0 && c0 < channels) {
#pragma unroll
    for (int k = 0; k < V; ++k) partial[blockIdx.y * channels + c0 + k] = s[k];
  }
}

// out[c] = factor * the sum of channel c's slab partials, rounded once to float. Lane y of the
// block adds slabs y, y + 32, ... in order, then lane 0 adds the lanes in order.
__global__ void total_kernel(const double* __restrict__ partial, int64_t slabs, int64_t channels, float factor,
                             float* __restrict__ out) {
  __shared__ double lanes[kTotalLanes][kTotalLanes];
  const int64_t c = blockIdx.x * int64_t{kTotalLanes} + threadIdx.x;
  double s = 0;
  if (c < channels) {
#pragma unroll 4
    for (int64_t k = threadIdx.y; k < slabs; k += kTotalLanes) s += partial[k * channels + c];
  }
  lanes[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || c >= channels) return;
  for (int k = 1; k < kTotalLanes; ++k) s += lanes[k][threadIdx.x];
  out[c] = static_cast<float>(static_cast<double>(factor) * s);
}

// The widest V (16 bytes at most) that divides the channels and to which x is aligned: every
// row then starts on a whole pack.
template <class T>
int width_for(const void* x, int64_t channels) {
  int v = 16 / static_cast<int>(sizeof(T));
  while (v > 1 && (channels % v != 0 || reinterpret_cast<uintptr_t>(x) % (v * sizeof(T)) != 0)) v /= 2;
  return v;
}

template <class T, int V>
void launch_slab_sums(const T* x, const Plan& p, int width, double* partial, cudaStream_t stream) {
  if constexpr (V > 1)
    if (width < V) return launch_slab_sums<T, V / 2>(x, p, width, partial, stream);
  // Below kBlockChannels channels V divides them; above, V divides kBlockChannels.
  const int across = static_cast<int>(std::min<int64_t>(p.channels, kBlockChannels)) / V;
  const dim3 grid(static_cast<unsigned>(p.channel_blocks), static_cast<unsigned>(p.slabs));
  slab_sums_kernel<T, V><<<grid, dim3(across, kThreads / across), 0, stream>>>(x, p.rows, p.channels, p.per_slab,
                                                                               partial);
}

}  // namespace

size_t channel_sums_work_bytes(int64_t rows, int64_t channels) {
  const Plan p(rows, channels);
  return static_cast<size_t>(p.slabs * p.channels) * sizeof(double);
}

void channel_sums(DType t, const void* x, int64_t rows, int64_t channels, float factor, float* out, void* work,
                  cudaStream_t stream) {
  const Plan p(rows, channels);
  auto* partial = static_cast<double*>(work);
  with_type(t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kWidest = static_cast<int>(16 / sizeof(T));
    launch_slab_sums<T, kWidest>(static_cast<const T*>(x), p, width_for<T>(x, channels), partial, stream);
  });
  CUDA_CHECK_LAUNCH();
  const auto blocks = static_cast<unsigned>((channels + kTotalLanes - 1) / kTotalLanes);
  total_kernel<<<blocks, dim3(kTotalLanes, kTotalLanes), 0, stream>>>(partial, p.slabs, channels, factor, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace hpc::kernels

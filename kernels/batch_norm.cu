// Batch norm in training, NHWC (nn::BatchNorm's CPU layer is the reference: network_test and
// kernels_test). cuDNN's legacy batch-norm calls ran NCHW kernels on our NHWC tensors and took
// 88% of a ResNet-50 step on an H200 (bench/README.md); these read the channels-innermost
// layout directly. Every per-channel sum is taken in double over fixed slabs of rows, and the
// slabs are added in a fixed order: the same bits on every run, whatever the GPU.
//
// Bytes are what a step pays for (the kernels are memory-bound), so the passes fuse what the
// layers around them would otherwise read and write again:
// - the forward's ReLU, and a residual block's join (y = relu(bn(x) + shortcut)), in the apply
//   pass: the separate add and ReLU passes each read and wrote the block's output again;
// - the backward's ReLU mask, recomputed from x with the forward's own coefficients (kept in
//   the work area), in both backward passes: no separate pass reads y and dy to write a masked
//   copy of dy. The recomputed mask is the one the forward stored, bit for bit (same
//   arithmetic, same rounding to T).
// Each thread moves 8 bytes at a time (V neighbouring channels of one row; 16 with another
// BatchNormTuning) where the channel count and the pointers allow it, and keeps its channels'
// coefficients in registers across the rows it visits: no division per element, and wide
// loads. The default launch (kernels.hpp) fits 64 registers a thread, four blocks a
// multiprocessor, and loops the apply passes over the rows in one wave of blocks: on an H200
// ResNet-50's batch norms took half the time of 16-byte loads at two blocks, whose masked
// backward passes spilled registers.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <iterator>
#include <string>
#include <type_traits>
#include <vector>

#include "core/cuda_check.hpp"
#include "kernels/kernels.hpp"
#include "kernels/launch.cuh"
#include "kernels/types.cuh"

namespace hpc::kernels {
namespace {

constexpr int kCoefficients = 4;   // per channel, for the elementwise passes (see the finalize kernels)
constexpr int kBlockThreads = 256;  // of the sums and apply kernels
constexpr int kSumBlocks = 1024;    // the most the sums kernel launches (slabs x channel blocks): the work area's
constexpr int kApplyBlocks = 2048;  // likewise for the apply passes
constexpr int kLanes = 32;          // finalize: channels per block ...
constexpr int kSlabLanes = 32;      // ... and lanes over the slabs
// The forward's normalised value of x, before the ReLU and the rounding to T. Written once and
// used by the forward and by the backward's recomputed mask: an explicit fused multiply-add,
// so no compiler choice can make the two differ.
__device__ __forceinline__ float affine(float x, const float* k) { return __fmaf_rn(x - k[0], k[1], k[2]); }

// Whether the forward's ReLU passed v: its stored output to_f(from_f<T>(max(v, 0))) is > 0
// exactly when the rounding of v itself is (a NaN gives 0 and is not passed, as the forward).
template <class T>
__device__ __forceinline__ bool relu_passes(float v) {
  return to_f(from_f<T>(v)) > 0.f;
}

// Channels c0 .. c0 + V - 1's first N coefficients (of the kCoefficients a channel has), into the
// registers of the thread that takes those channels.
template <int V, int N>
__device__ __forceinline__ void load_coefficients(const float* __restrict__ coef, int c0, float (&k)[V][N]) {
#pragma unroll
  for (int j = 0; j < V; ++j)
#pragma unroll
    for (int q = 0; q < N; ++q) k[j][q] = coef[kCoefficients * (c0 + j) + q];
}

// A thread's R rows r0, r0 + step, ... (those before `end`), V channels from c0: of x into xv and,
// when kSecond, of `second` into sv. All of them before any is used: bytes in flight.
template <bool kSecond, class T, int V, int R>
__device__ __forceinline__ void load_rows(const T* __restrict__ x, const T* __restrict__ second, int64_t r0,
                                          int64_t step, int64_t end, int channels, int c0, Pack<T, V> (&xv)[R],
                                          Pack<T, V> (&sv)[R]) {
#pragma unroll
  for (int u = 0; u < R; ++u) {
    const int64_t r = r0 + u * step;
    if (r < end) {
      xv[u] = *reinterpret_cast<const Pack<T, V>*>(x + r * channels + c0);
      if (kSecond) sv[u] = *reinterpret_cast<const Pack<T, V>*>(second + r * channels + c0);
    }
  }
}

// The apply passes' walk: the thread's rows (a grid-stride loop, R rows loaded at a time) of x and,
// when kSecond, of `second`, V channels from c0, each row's written to y: channel j's value is
// value(xv, sv, j), xv and sv the row's packs of x and `second` (sv not loaded without kSecond).
template <bool kSecond, class T, int V, int R, class Value>
__device__ __forceinline__ void apply_rows(const T* __restrict__ x, const T* __restrict__ second, T* __restrict__ y,
                                           int64_t rows, int channels, int c0, const Value& value) {
  const int64_t step = static_cast<int64_t>(gridDim.y) * blockDim.y;
  for (int64_t r0 = blockIdx.y * static_cast<int64_t>(blockDim.y) + threadIdx.y; r0 < rows; r0 += R * step) {
    Pack<T, V> xv[R], sv[R];
    load_rows<kSecond>(x, second, r0, step, rows, channels, c0, xv, sv);
#pragma unroll
    for (int u = 0; u < R; ++u) {
      const int64_t r = r0 + u * step;
      if (r >= rows) break;
      Pack<T, V> out;
#pragma unroll
      for (int j = 0; j < V; ++j) out.v[j] = value(xv[u], sv[u], j);
      *reinterpret_cast<Pack<T, V>*>(y + r * channels + c0) = out;
    }
  }
}

// Launch geometry: a thread takes V neighbouring channels (cv = channels / V vectors per row);
// a block is bx vectors by `by` rows; grid.x covers the vectors, grid.y the rows (slabs for
// the sums). A deterministic function of (T, rows, channels): the slabs, hence the bits, of
// every run of a shape are the same.
struct Geometry {
  Geometry(int v, int64_t rows, int64_t channels, int target_blocks) : vec(v) {
    // (Before any division by the shape: the layers' own checks come after their members' geometry.)
    HPC_CHECK(rows > 0 && channels >= v && v > 0, "a batch norm of ", rows, " rows of ", channels, " channels");
    const int64_t cv = channels / v;
    bx = static_cast<int>(std::min<int64_t>(cv, 32));
    by = kBlockThreads / bx;
    gx = static_cast<unsigned>((cv + bx - 1) / bx);
    const int64_t row_groups = std::max<int64_t>((rows + by - 1) / by, 1);
    gy = static_cast<unsigned>(std::clamp<int64_t>(target_blocks / static_cast<int64_t>(gx), 1, row_groups));
    per_slab = (rows + gy - 1) / gy;
  }
  dim3 grid() const { return dim3(gx, gy); }
  dim3 block() const { return dim3(static_cast<unsigned>(bx), static_cast<unsigned>(by)); }
  int vec, bx, by;
  unsigned gx, gy;
  int64_t per_slab;
};

// ---- the fused finalize (BatchNormTuning::fused_finalize) ------------------------------------
// The sums pass finishes the channels itself, without the finalize kernel's launch (7.7 us a
// launch on an H200, 53 forward and 53 backward in a ResNet-50 step). The CUDA programming
// guide's last-block pattern (threadFenceReduction), twice, per column of channel blocks
// (blockIdx.x): the last block to write a partial sum of lane r's slabs (r, r + 32, ..., as
// total_of's lane r takes them) adds them in that order and writes the lane's total over slab
// r's partial sums; the last of the column's lanes to do so adds the lanes in order and
// finishes the column's channels. The same additions in the same order as total_of: the same
// bits as the finalize kernel, and the work of the last blocks is spread over 32 lanes.
// Its counters, kChainCounters per column at the start of the work area, start at zero (the
// work area is zeroed once when allocated) and each last block sets its own back to zero, so
// every launch, a graph's replays included, finds them at zero.
constexpr int kChainCounters = kSlabLanes + 1;  // per column: one per lane, one for the lanes

struct Unfused {};  // the sums pass leaves its partial sums to the finalize kernel

// Whether this block is the last of `count` to arrive at *counter: the writes of every thread
// of the blocks before it are then visible to all of its threads (threadfence, then the atomic
// ticket; threadfence after it). A ticket past the count means the counter was not zero when
// the launch began (a work area not zeroed): the launch traps, an error at the next
// synchronisation. Only then: a counter left at g with 0 < g < count makes a block that is not
// the last take itself for it, and the statistics come out wrong without a word. Nothing leaves
// one so: every completed launch leaves its counters at zero, whatever the channel count (a
// trapped launch leaves the context unusable anyway), and each layer has a work area of its own.
__device__ bool arrive_last(unsigned* counter, unsigned count) {
  __shared__ bool last_block;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0) {
    const unsigned ticket = atomicAdd(counter, 1u);
    if (ticket >= count) __trap();
    last_block = ticket + 1 == count;
    if (last_block) *counter = 0;  // all `count` have arrived: ready for the next launch
  }
  __syncthreads();
  const bool last = last_block;
  if (last) __threadfence();
  return last;
}

// Lane `lane`'s totals of the channels [first, first + count): its slabs' partial sums added to
// zero in slab order, as total_of's lane adds them, written over slab `lane`'s (read by this
// lane alone). Loads through L2 (__ldcg): other blocks wrote them in this launch.
__device__ void lane_totals(double* partial, unsigned slabs, int channels, unsigned lane, int first, int count) {
  for (int i = threadIdx.y * blockDim.x + threadIdx.x; i < 2 * count; i += blockDim.x * blockDim.y) {
    const int64_t at = (i < count ? 0 : channels) + first + i % count;  // sum, or the second sum, of a channel
    double s = 0;
#pragma unroll 4
    for (int64_t slab = lane; slab < slabs; slab += kSlabLanes) s += __ldcg(partial + slab * 2 * channels + at);
    partial[lane * 2 * static_cast<int64_t>(channels) + at] = s;
  }
}

// total_of's last step and the finish: lane 0's totals plus lanes 1 .. 31's in order (zero for
// a lane without slabs, as total_of's), then the channel's statistics and coefficients.
template <class Finish>
__device__ void lanes_in_order(const double* partial, unsigned slabs, int channels, int first, int count,
                               const Finish& finish) {
  for (int i = threadIdx.y * blockDim.x + threadIdx.x; i < count; i += blockDim.x * blockDim.y) {
    const int c = first + i;
    double a = __ldcg(partial + c), b = __ldcg(partial + channels + c);
    for (unsigned k = 1; k < kSlabLanes; ++k) {
      a += k < slabs ? __ldcg(partial + k * 2 * static_cast<int64_t>(channels) + c) : 0.0;
      b += k < slabs ? __ldcg(partial + (k * 2 + 1) * static_cast<int64_t>(channels) + c) : 0.0;
    }
    finish(c, a, b);
  }
}

// After a block of the sums pass has written its partial sums: the lane's last block takes the
// lane's totals, the column's last lane finishes the column (V channels a thread of blockDim.x).
template <int V, class Finish>
__device__ void finish_if_last(double* partial, int channels, unsigned* counters, const Finish& finish) {
  const unsigned slabs = gridDim.y, lane = blockIdx.y % kSlabLanes;
  unsigned* column = counters + blockIdx.x * kChainCounters;
  if (!arrive_last(column + lane, (slabs - 1 - lane) / kSlabLanes + 1)) return;
  const int first = blockIdx.x * blockDim.x * V, count = min(static_cast<int>(blockDim.x) * V, channels - first);
  lane_totals(partial, slabs, channels, lane, first, count);
  if (!arrive_last(column + kSlabLanes, min(slabs, static_cast<unsigned>(kSlabLanes)))) return;
  lanes_in_order(partial, slabs, channels, first, count, finish);
}

// partial[slab][0][c] and partial[slab][1][c]: over the slab's rows, the sums of x and x^2
// (forward), or of g and g (x - mean[c]) (backward), g = dy, or dy where the forward's ReLU
// passed (kMask, with the forward's coefficients fcoef), each added in double. A thread loads
// R rows before it adds: enough bytes in flight to keep the memory busy. With a Finish other
// than Unfused, the last blocks also finish the channels (finish_if_last, with `counters`).
template <class T, int V, int B, int R, bool kBackward, bool kMask, class Finish>
__global__ void __launch_bounds__(kBlockThreads, B)
    partial_sums_kernel(const T* __restrict__ x, const T* __restrict__ dy, const float* __restrict__ fcoef,
                        int64_t rows, int channels, int64_t rows_per_slab, double* __restrict__ partial,
                        Finish finish, unsigned* counters) {
  __shared__ double s0[kBlockThreads][V], s1[kBlockThreads][V];
  const int vi = blockIdx.x * blockDim.x + threadIdx.x, c0 = vi * V;
  const int64_t begin = blockIdx.y * rows_per_slab;
  const int64_t end = begin + rows_per_slab < rows ? begin + rows_per_slab : rows;
  double a[V], b[V];
  float k[V][3];
#pragma unroll
  for (int j = 0; j < V; ++j) a[j] = 0, b[j] = 0;
  if (c0 < channels) {
    if (kBackward) load_coefficients(fcoef, c0, k);
    const int64_t step = blockDim.y;
    for (int64_t r0 = begin + threadIdx.y; r0 < end; r0 += R * step) {
      Pack<T, V> xv[R], gv[R];
      load_rows<kBackward>(x, dy, r0, step, end, channels, c0, xv, gv);
#pragma unroll
      for (int u = 0; u < R; ++u) {
        if (r0 + u * step >= end) break;
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const float xf = to_f(xv[u].v[j]);
          if (kBackward) {
            double g = to_f(gv[u].v[j]);
            if (kMask && !relu_passes<T>(affine(xf, k[j]))) g = 0;
            a[j] += g;
            b[j] += g * (static_cast<double>(xf) - static_cast<double>(k[j][0]));
          } else {
            const double v = xf;
            a[j] += v;
            b[j] += v * v;
          }
        }
      }
    }
  }
  const int t = threadIdx.y * blockDim.x + threadIdx.x;
#pragma unroll
  for (int j = 0; j < V; ++j) s0[t][j] = a[j], s1[t][j] = b[j];
  __syncthreads();
  if (threadIdx.y == 0 && c0 < channels) {
    for (int y = 1; y < static_cast<int>(blockDim.y); ++y) {  // the rows' lanes, in order
      const int u = y * blockDim.x + threadIdx.x;
#pragma unroll
      for (int j = 0; j < V; ++j) a[j] += s0[u][j], b[j] += s1[u][j];
    }
#pragma unroll
    for (int j = 0; j < V; ++j) {
      partial[(blockIdx.y * 2) * static_cast<int64_t>(channels) + c0 + j] = a[j];
      partial[(blockIdx.y * 2 + 1) * static_cast<int64_t>(channels) + c0 + j] = b[j];
    }
  }
  if constexpr (!std::is_same_v<Finish, Unfused>) finish_if_last<V>(partial, channels, counters, finish);
}

// The slabs' sums of channel c, added in a fixed order: lane y of the block takes slabs y,
// y + kSlabLanes, ..., then lane 0 adds the lanes in order. Every thread of the block must call it.
__device__ void total_of(const double* partial, int64_t slabs, int channels, int c, double& a, double& b) {
  __shared__ double s0[kSlabLanes][kLanes], s1[kSlabLanes][kLanes];
  a = 0, b = 0;
  if (c < channels)
#pragma unroll 4
    for (int64_t s = threadIdx.y; s < slabs; s += kSlabLanes)
      a += partial[(s * 2) * channels + c], b += partial[(s * 2 + 1) * channels + c];
  s0[threadIdx.y][threadIdx.x] = a;
  s1[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0)
    for (int k = 1; k < kSlabLanes; ++k) a += s0[k][threadIdx.x], b += s1[k][threadIdx.x];
}

// Forward: the statistics, the running averages, and for the elementwise pass (mean, scale,
// shift): y = (x - mean) * scale + shift with scale = gamma * invstd, shift = beta. Called with
// channel c's two totals by the finalize kernel or by the fused sums pass's last block: one
// body, so both compute the same bits from the same totals.
struct ForwardFinish {
  const float *gamma, *beta;
  float *running_mean, *running_var;
  double momentum, eps;
  float *save_mean, *save_invstd, *coef;
  int64_t rows;
  __device__ void operator()(int c, double sum, double squares) const {
    // Every product and sum rounded on its own (the _rn intrinsics): the compiler may contract a
    // plain a * b - c into one FMA, and could choose differently in the finalize kernel and in the
    // fused sums pass; written so, both compute the same bits.
    const double n = static_cast<double>(rows), mean = sum / n;
    const double var = fmax(__dsub_rn(squares / n, __dmul_rn(mean, mean)), 0.0);  // biased: the one that normalises
    const double invstd = 1.0 / sqrt(var + eps);
    save_mean[c] = static_cast<float>(mean);
    save_invstd[c] = static_cast<float>(invstd);
    const double keep = 1 - momentum;
    running_mean[c] = static_cast<float>(__dadd_rn(__dmul_rn(keep, running_mean[c]), __dmul_rn(momentum, mean)));
    running_var[c] = static_cast<float>(
        __dadd_rn(__dmul_rn(keep, running_var[c]), __dmul_rn(__dmul_rn(momentum, var), n) / (n - 1)));
    float* k = coef + kCoefficients * c;
    k[0] = static_cast<float>(mean);
    k[1] = static_cast<float>(gamma[c] * invstd);
    k[2] = beta[c];
    k[3] = 0;
  }
};

// Backward: dgamma = factor sum g xhat, dbeta = factor sum g, and for the elementwise pass
// (mean, a, k, b): dx = a g + k (x - mean) + b, which is
// gamma invstd (g - mean(g) - xhat mean(g xhat)) with xhat = (x - mean) invstd.
struct BackwardFinish {
  const float *gamma, *save_mean, *save_invstd;
  float param_factor;
  float *dgamma, *dbeta, *coef;
  int64_t rows;
  __device__ void operator()(int c, double sum_dy, double sum_dy_centred) const {
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
};

// The finalize kernels: each channel's totals over the slabs (total_of), then its finish.
template <class Finish>
__device__ void finalize(const double* partial, int64_t slabs, int channels, const Finish& finish) {
  const int c = blockIdx.x * kLanes + threadIdx.x;
  double a, b;
  total_of(partial, slabs, channels, c, a, b);
  if (threadIdx.y != 0 || c >= channels) return;
  finish(c, a, b);
}
__global__ void __launch_bounds__(kLanes * kSlabLanes)
    forward_finalize_kernel(const double* partial, int64_t slabs, int channels, ForwardFinish finish) {
  finalize(partial, slabs, channels, finish);
}
__global__ void __launch_bounds__(kLanes * kSlabLanes)
    backward_finalize_kernel(const double* partial, int64_t slabs, int channels, BackwardFinish finish) {
  finalize(partial, slabs, channels, finish);
}

// y = bn(x), then (kResidual) rounded and added to the shortcut's r, then max(., 0) when relu:
// the same roundings as the separate passes it replaces (bn rounded to T, the sum rounded).
template <class T, int V, int B, int R, bool kResidual>
__global__ void __launch_bounds__(kBlockThreads, B)
    forward_apply_kernel(const T* __restrict__ x, const T* __restrict__ residual, T* __restrict__ y, int64_t rows,
                         int channels, const float* __restrict__ coef, bool relu) {
  const int vi = blockIdx.x * blockDim.x + threadIdx.x, c0 = vi * V;
  if (c0 >= channels) return;
  float k[V][3];
  load_coefficients(coef, c0, k);
  apply_rows<kResidual, T, V, R>(x, residual, y, rows, channels, c0,
                                 [&](const Pack<T, V>& xv, const Pack<T, V>& rv, int j) {
                                   float v = affine(to_f(xv.v[j]), k[j]);
                                   if (kResidual) v = to_f(from_f<T>(v)) + to_f(rv.v[j]);
                                   if (relu) v = v > 0.f ? v : 0.f;
                                   return from_f<T>(v);
                                 });
}

// dx = a g + k (x - mean) + b with the backward's coefficients bcoef, g = dy or (kMask) dy
// where the forward's ReLU passed (the forward's coefficients fcoef).
template <class T, int V, int B, int R, bool kMask>
__global__ void __launch_bounds__(kBlockThreads, B)
    backward_apply_kernel(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dx, int64_t rows,
                          int channels, const float* __restrict__ fcoef, const float* __restrict__ bcoef) {
  const int vi = blockIdx.x * blockDim.x + threadIdx.x, c0 = vi * V;
  if (c0 >= channels) return;
  // k[j][0] is the forward's mean, as f[j][0] is (both save_mean): kept once.
  float f[V][3], k[V][kCoefficients];
#pragma unroll
  for (int j = 0; j < V; ++j) {
#pragma unroll
    for (int q = 0; q < kCoefficients; ++q) k[j][q] = bcoef[kCoefficients * (c0 + j) + q];
    f[j][0] = k[j][0];
#pragma unroll
    for (int q = 1; q < 3; ++q) f[j][q] = kMask ? fcoef[kCoefficients * (c0 + j) + q] : 0.f;
  }
  apply_rows<true, T, V, R>(x, dy, dx, rows, channels, c0, [&](const Pack<T, V>& xv, const Pack<T, V>& gv, int j) {
    const float xf = to_f(xv.v[j]);
    float g = to_f(gv.v[j]);
    if (kMask && !relu_passes<T>(affine(xf, f[j]))) g = 0.f;
    return from_f<T>(k[j][1] * g + k[j][2] * (xf - k[j][0]) + k[j][3]);
  });
}

BatchNormTuning tuning_from_environment();

// The launch in use: HPCTRAIN_BN_TUNING's when set (read at the first call), else the defaults;
// set_batch_norm_tuning replaces it (tests and benchmarks, between steps).
BatchNormTuning& current_tuning() {
  static BatchNormTuning t = tuning_from_environment();
  return t;
}

// The multiprocessors of the current device (asked once per device): the apply passes' one wave.
int multiprocessors() {
  static int count[64] = {};
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  int& n = count[device & 63];
  if (n == 0) CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
  return n;
}

// Calls f with (V, B, R) as compile-time constants: V of 16 bytes of T, of 8, or 1; B blocks a
// multiprocessor is compiled for and R rows a thread loads before it computes, as tuned (V = 1,
// the fallback for odd channel counts, always with 2 and 4).
template <class T, class F>
void with_launch(int v, F&& f) {
  constexpr int wide = 16 / static_cast<int>(sizeof(T)), half = wide / 2;
  using I2 = std::integral_constant<int, 2>;
  using I4 = std::integral_constant<int, 4>;
  auto at = [&](auto width) {
    const bool b4 = current_tuning().blocks_per_sm == 4, r2 = current_tuning().rows == 2;
    if (b4 && r2) f(width, I4{}, I2{});
    else if (b4) f(width, I4{}, I4{});
    else if (r2) f(width, I2{}, I2{});
    else f(width, I2{}, I4{});
  };
  if (v == wide) at(std::integral_constant<int, wide>{});
  else if (v == half) at(std::integral_constant<int, half>{});
  else f(std::integral_constant<int, 1>{}, I2{}, I4{});
}

// One call's plan: the geometry of its sums and of its apply pass, and the parts of its work
// area: the fused finalize's counters (zero between calls), the forward's per-channel
// coefficients (kept there for the backward's mask and centre), the backward's, then the slabs'
// partial sums in double. The counters and coefficients come first, at offsets that do not
// depend on the call's vector width (the backward's pointers may allow another width than the
// forward's). The sums' geometry is a function of the shape and the tuning alone (their bits
// repeat on any GPU); the apply pass's may follow the GPU.
struct Plan {
  Plan(void* work, int v, int64_t rows, int64_t channels)
      : sums(v, rows, channels, current_tuning().sum_blocks),
        apply(v, rows, channels,
              current_tuning().one_wave ? multiprocessors() * current_tuning().blocks_per_sm : kApplyBlocks),
        c(static_cast<int>(channels)),
        counters(static_cast<unsigned*>(work)),
        fcoef(reinterpret_cast<float*>(static_cast<char*>(work) + counter_bytes(channels))),
        bcoef(fcoef + kCoefficients * channels),
        partial(reinterpret_cast<double*>(static_cast<char*>(work) + counter_bytes(channels) +
                                          coefficient_bytes(channels))) {
    HPC_CHECK(rows > 1 && channels > 0 && channels <= INT32_MAX / kCoefficients,
              "batch norm of ", rows, " rows x ", channels, " channels");
  }
  // Every width a call of this shape may take (1, or 16 or 8 bytes of the type, whatever the
  // tuning, at the most sum blocks): the work area holds the partial sums of the one with the
  // most slabs.
  static size_t bytes(int wide, int64_t rows, int64_t channels) {
    size_t slabs = 0;
    for (int v : {1, wide / 2, wide})
      if (channels % v == 0) slabs = std::max<size_t>(slabs, Geometry(v, rows, channels, kSumBlocks).gy);
    return counter_bytes(channels) + coefficient_bytes(channels) +
           slabs * 2 * static_cast<size_t>(channels) * sizeof(double);
  }
  // kChainCounters per column of channel blocks, for the most columns any width has (a block is
  // at most 32 vectors of at least one channel wide), rounded up to 16 bytes.
  static size_t counter_bytes(int64_t channels) {
    const size_t columns = static_cast<size_t>((channels + 31) / 32);
    return (kChainCounters * columns * sizeof(unsigned) + 15) / 16 * 16;
  }
  // Both sets, rounded up to 16 bytes (the partial sums that follow are doubles).
  static size_t coefficient_bytes(int64_t channels) {
    return (2 * kCoefficients * static_cast<size_t>(channels) * sizeof(float) + 15) / 16 * 16;
  }
  dim3 finalize_grid() const { return dim3(static_cast<unsigned>((c + kLanes - 1) / kLanes)); }
  static dim3 finalize_block() { return dim3(kLanes, kSlabLanes); }

  Geometry sums, apply;
  int c;
  unsigned* counters;
  float *fcoef, *bcoef;
  double* partial;
};

void finalize(const Plan& p, const ForwardFinish& finish, cudaStream_t stream) {
  forward_finalize_kernel<<<p.finalize_grid(), Plan::finalize_block(), 0, stream>>>(p.partial, p.sums.gy, p.c, finish);
  CUDA_CHECK_LAUNCH();
}
void finalize(const Plan& p, const BackwardFinish& finish, cudaStream_t stream) {
  backward_finalize_kernel<<<p.finalize_grid(), Plan::finalize_block(), 0, stream>>>(p.partial, p.sums.gy, p.c, finish);
  CUDA_CHECK_LAUNCH();
}

// The statistics of a call: the sums pass, then the finalize kernel; or, with the tuning's
// fused_finalize, the sums pass alone, its last blocks finishing the channels (the same bits).
// The backward's sums read the forward's coefficients (fcoef); the forward's read none.
template <class T, int V, int B, int R, bool kBackward, bool kMask, class Finish>
void statistics(const Plan& p, const T* x, const T* dy, int64_t rows, const Finish& finish, cudaStream_t stream) {
  const float* fcoef = kBackward ? p.fcoef : nullptr;
  if (current_tuning().fused_finalize) {
    partial_sums_kernel<T, V, B, R, kBackward, kMask, Finish><<<p.sums.grid(), p.sums.block(), 0, stream>>>(
        x, dy, fcoef, rows, p.c, p.sums.per_slab, p.partial, finish, p.counters);
    CUDA_CHECK_LAUNCH();
    return;
  }
  partial_sums_kernel<T, V, B, R, kBackward, kMask, Unfused><<<p.sums.grid(), p.sums.block(), 0, stream>>>(
      x, dy, fcoef, rows, p.c, p.sums.per_slab, p.partial, Unfused{}, nullptr);
  CUDA_CHECK_LAUNCH();
  finalize(p, finish, stream);
}

}  // namespace

size_t batch_norm_work_bytes(DType t, int64_t rows, int64_t channels) {
  size_t bytes = 0;
  with_type(t, [&](auto tag) { bytes = Plan::bytes(16 / static_cast<int>(sizeof(tag)), rows, channels); });
  return bytes;
}

void batch_norm_forward_train(DType t, const void* x, void* y, int64_t rows, int64_t channels, const float* gamma,
                              const float* beta, float* running_mean, float* running_var, double momentum,
                              double eps, bool relu, float* save_mean, float* save_invstd, void* work,
                              cudaStream_t stream, const void* residual) {
  with_type(t, [&](auto tag) {
    using T = decltype(tag);
    const Plan p(work, pack_width<T>(channels, {x, y, residual}, current_tuning().pack_bytes), rows, channels);
    with_launch<T>(p.sums.vec, [&](auto width, auto blocks, auto depth) {
      constexpr int V = decltype(width)::value, B = decltype(blocks)::value, R = decltype(depth)::value;
      const ForwardFinish finish{gamma, beta, running_mean, running_var, momentum, eps, save_mean, save_invstd,
                                 p.fcoef, rows};
      statistics<T, V, B, R, false, false>(p, static_cast<const T*>(x), nullptr, rows, finish, stream);
      const auto* xt = static_cast<const T*>(x);
      const auto* rt = static_cast<const T*>(residual);
      auto* yt = static_cast<T*>(y);
      if (residual)
        forward_apply_kernel<T, V, B, R, true>
            <<<p.apply.grid(), p.apply.block(), 0, stream>>>(xt, rt, yt, rows, p.c, p.fcoef, relu);
      else
        forward_apply_kernel<T, V, B, R, false>
            <<<p.apply.grid(), p.apply.block(), 0, stream>>>(xt, nullptr, yt, rows, p.c, p.fcoef, relu);
    });
  });
  CUDA_CHECK_LAUNCH();
}

void batch_norm_backward(DType t, const void* x, const void* dy, void* dx, int64_t rows, int64_t channels,
                         const float* gamma, const float* save_mean, const float* save_invstd, float param_factor,
                         float* dgamma, float* dbeta, void* work, cudaStream_t stream, bool relu) {
  with_type(t, [&](auto tag) {
    using T = decltype(tag);
    const Plan p(work, pack_width<T>(channels, {x, dy, dx}, current_tuning().pack_bytes), rows, channels);
    with_launch<T>(p.sums.vec, [&](auto width, auto blocks, auto depth) {
      constexpr int V = decltype(width)::value, B = decltype(blocks)::value, R = decltype(depth)::value;
      const auto* xt = static_cast<const T*>(x);
      const auto* gt = static_cast<const T*>(dy);
      // The sums' centre is the forward's mean as it kept it (fcoef[0] = save_mean, one float).
      const BackwardFinish finish{gamma, save_mean, save_invstd, param_factor, dgamma, dbeta, p.bcoef, rows};
      if (relu) statistics<T, V, B, R, true, true>(p, xt, gt, rows, finish, stream);
      else statistics<T, V, B, R, true, false>(p, xt, gt, rows, finish, stream);
      auto* dxt = static_cast<T*>(dx);
      if (relu)
        backward_apply_kernel<T, V, B, R, true>
            <<<p.apply.grid(), p.apply.block(), 0, stream>>>(xt, gt, dxt, rows, p.c, p.fcoef, p.bcoef);
      else
        backward_apply_kernel<T, V, B, R, false>
            <<<p.apply.grid(), p.apply.block(), 0, stream>>>(xt, gt, dxt, rows, p.c, p.fcoef, p.bcoef);
    });
  });
  CUDA_CHECK_LAUNCH();
}

namespace {
// The values each field may take (with_launch instantiates the kernels for these, Plan::bytes
// sizes the work area for the most sum blocks), listed once for the check and the enumeration.
constexpr int kPackBytes[] = {16, 8}, kBlocksPerSm[] = {2, 4}, kRowsInFlight[] = {4, 2},
              kSumBlockCounts[] = {kSumBlocks, kSumBlocks / 2, kSumBlocks / 4};

template <size_t N>
bool one_of(int v, const int (&values)[N]) {
  return std::find(std::begin(values), std::end(values), v) != std::end(values);
}

constexpr bool sum_blocks_fit_the_work_area() {
  for (int b : kSumBlockCounts)
    if (b > kSumBlocks) return false;
  return true;
}
static_assert(sum_blocks_fit_the_work_area(), "Plan::bytes sizes the partial sums for kSumBlocks slabs at most");

// `as_written`: the text the tuning was read from, named in the error as the user wrote it.
void check_tuning(const BatchNormTuning& t, const std::string& as_written = {}) {
  if (!one_of(t.pack_bytes, kPackBytes) || !one_of(t.blocks_per_sm, kBlocksPerSm) || !one_of(t.rows, kRowsInFlight) ||
      !one_of(t.sum_blocks, kSumBlockCounts))
    throw Error(ErrorKind::Usage, "batch-norm tuning '" + (as_written.empty() ? batch_norm_tuning_text(t) : as_written) +
                                      "': pack bytes 16 or 8, blocks per multiprocessor 2 or 4, rows 2 or 4, "
                                      "one wave 0 or 1, sum blocks 1024, 512 or 256");
}

BatchNormTuning tuning_from_environment() {
  const char* text = std::getenv("HPCTRAIN_BN_TUNING");
  if (!text || !*text) return {};
  try {
    return parse_batch_norm_tuning(text);
  } catch (const Error& e) {
    throw Error(ErrorKind::Usage, std::string("HPCTRAIN_BN_TUNING: ") + e.what());
  }
}
}  // namespace

void set_batch_norm_tuning(const BatchNormTuning& tuning) {
  check_tuning(tuning);
  current_tuning() = tuning;
}

BatchNormTuning batch_norm_tuning() { return current_tuning(); }

std::string batch_norm_tuning_text(const BatchNormTuning& t) {
  return std::to_string(t.pack_bytes) + "," + std::to_string(t.blocks_per_sm) + "," + std::to_string(t.rows) + "," +
         (t.one_wave ? "1" : "0") + "," + std::to_string(t.sum_blocks) + (t.fused_finalize ? ",1" : "");
}

// Each unfused choice, then its fused twin (the default's twin after the default's place).
std::vector<BatchNormTuning> batch_norm_tunings() {
  std::vector<BatchNormTuning> all{BatchNormTuning{}};
  for (int pack : kPackBytes)
    for (int blocks : kBlocksPerSm)
      for (int rows : kRowsInFlight)
        for (bool wave : {false, true})
          for (int sums : kSumBlockCounts)
            for (bool fused : {false, true}) {
              const BatchNormTuning t{pack, blocks, rows, wave, sums, fused};
              if (batch_norm_tuning_text(t) != batch_norm_tuning_text(all.front())) all.push_back(t);
            }
  return all;
}

namespace {
// Whole numbers between commas; empty when the text is not that.
std::vector<int> comma_numbers(const std::string& text) {
  std::vector<int> v;
  size_t at = 0;
  while (!text.empty()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string field = text.substr(at, comma - at);
    if (field.empty() || field.size() >= 9 || field.find_first_not_of("0123456789") != std::string::npos) return {};
    v.push_back(std::stoi(field));
    if (comma == text.size()) break;
    at = comma + 1;
  }
  return v;
}
}  // namespace

BatchNormTuning parse_batch_norm_tuning(const std::string& text) {
  // Four to six numbers: the sum blocks may be left out (the default's), and the fused finalize
  // (0, the default, or 1) after them.
  const std::vector<int> v = comma_numbers(text);
  const bool flags = v.size() >= 4 && v[3] <= 1 && (v.size() < 6 || v[5] <= 1);
  if (v.size() < 4 || v.size() > 6 || !flags)
    throw Error(ErrorKind::Usage, "batch-norm tuning '" + text +
                                      "': want PACK_BYTES,BLOCKS_PER_SM,ROWS,ONE_WAVE[,SUM_BLOCKS[,FUSED]] "
                                      "(as 8,4,2,1,1024)");
  BatchNormTuning t;
  t.pack_bytes = v[0], t.blocks_per_sm = v[1], t.rows = v[2], t.one_wave = v[3] == 1;
  if (v.size() >= 5) t.sum_blocks = v[4];
  if (v.size() == 6) t.fused_finalize = v[5] == 1;
  check_tuning(t, text);
  return t;
}

}  // namespace hpc::kernels

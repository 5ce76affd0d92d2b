// Max-pool backward, NHWC, optionally padded (nn::MaxPool2d and batch norm's fused pool are the
// reference: kernels_test, network_test). cuDNN's deterministic max-pool backward took 2.4 ms
// at 206 GB/s for ResNet-50's one stem pool on an H200 (issue 40). These keep no argmax: each
// window's winner is found again from the forward's input, which the threads of a window read
// from cache, with the CPU's rule (src/nn/pool_row.hpp, MaxPool2d::padded_forward): the
// window's first cell inside the image starts as the maximum (padding cells never take part)
// and a later cell replaces it only when strictly greater, in row-major order, so ties
// (all-zero windows after a ReLU) go to the first and a NaN wins only as the first cell. No
// atomics: every dx element is written by one thread, its windows' gradients added in a fixed
// order.
#include <cstdint>

#include "core/cuda_check.hpp"
#include "core/error.hpp"
#include "kernels/kernels.hpp"
#include "kernels/launch.cuh"
#include "kernels/types.cuh"

namespace hpc::kernels {
namespace {

template <class T, int V>
__device__ __forceinline__ Pack<T, V> load(const T* p) {
  return *reinterpret_cast<const Pack<T, V>*>(p);
}

template <class T, int V>
__device__ __forceinline__ void store(T* p, const Pack<T, V>& pack) {
  *reinterpret_cast<Pack<T, V>*>(p) = pack;
}

struct PoolShape {
  int64_t n, h, w, c, ho, wo;
  int k, s, pad;
};

// Per channel of the pack, the winner's place (kh * k + kw) in the window whose first cell
// is `corner`; the cells of the window are `pitch` elements apart per row, c per column.
template <class T, int V>
__device__ __forceinline__ void winners(const T* corner, int64_t pitch, int64_t c, int k, int (&at)[V]) {
  float best[V];
  const Pack<T, V> first = load<T, V>(corner);
#pragma unroll
  for (int j = 0; j < V; ++j) best[j] = to_f(first.v[j]), at[j] = 0;
  for (int kh = 0; kh < k; ++kh) {
    for (int kw = kh == 0 ? 1 : 0; kw < k; ++kw) {
      const Pack<T, V> p = load<T, V>(corner + kh * pitch + kw * c);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float v = to_f(p.v[j]);
        if (v > best[j]) best[j] = v, at[j] = kh * k + kw;
      }
    }
  }
}

// As winners, for the window whose corner (r0, c0) may lie in the padding (negative, or the
// window running past row h or column w): only its cells inside the image take part. `image`
// points at the image's first cell (and the pack's channel).
template <class T, int V>
__device__ __forceinline__ void clipped_winners(const T* image, int64_t r0, int64_t c0, const PoolShape& g,
                                                int (&at)[V]) {
  const int64_t kh0 = max(int64_t{0}, -r0), kh1 = min(int64_t{g.k}, g.h - r0);
  const int64_t kw0 = max(int64_t{0}, -c0), kw1 = min(int64_t{g.k}, g.w - c0);
  float best[V];
#pragma unroll
  for (int j = 0; j < V; ++j) best[j] = 0.f, at[j] = 0;  // replaced by the first cell below
  for (int64_t kh = kh0; kh < kh1; ++kh) {
    for (int64_t kw = kw0; kw < kw1; ++kw) {
      const Pack<T, V> p = load<T, V>(image + ((r0 + kh) * g.w + c0 + kw) * g.c);
      const bool first = kh == kh0 && kw == kw0;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float v = to_f(p.v[j]);
        if (first || v > best[j]) best[j] = v, at[j] = static_cast<int>(kh * g.k + kw);
      }
    }
  }
}

// Windows that do not overlap (kernel <= stride) and no padding: one thread per window and pack of channels
// reads the window once and writes the cells it owns, its stride x stride block (the last
// window of a row or column owns the rest of the image too): dy at each winner, +0 elsewhere,
// as the CPU layer's dense backward writes them.
template <class T, int V>
__global__ void max_pool_backward_dense_kernel(const T* x, const T* dy, T* dx, PoolShape g) {
  const int64_t packs = g.c / V, total = g.n * g.ho * g.wo * packs;
  HPC_GRID_STRIDE(i, total) {
    int64_t rest = i / packs;
    const int64_t ow = rest % g.wo;
    rest /= g.wo;
    const int64_t oh = rest % g.ho, b = rest / g.ho;
    const int64_t r0 = oh * g.s, c0 = ow * g.s;
    const int64_t r1 = oh == g.ho - 1 ? g.h : r0 + g.s, c1 = ow == g.wo - 1 ? g.w : c0 + g.s;
    const int64_t image = b * g.h * g.w * g.c + i % packs * V;  // channel of the pack in image b
    int at[V];
    winners<T, V>(x + image + (r0 * g.w + c0) * g.c, g.w * g.c, g.c, g.k, at);
    const Pack<T, V> grad = load<T, V>(dy + i * V);  // i * V: the pack's place in n x ho x wo x c
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t col = c0; col < c1; ++col) {
        const int64_t kh = r - r0, kw = col - c0;
        const int pos = kh < g.k && kw < g.k ? static_cast<int>(kh * g.k + kw) : -1;
        Pack<T, V> out;
#pragma unroll
        for (int j = 0; j < V; ++j) out.v[j] = at[j] == pos ? grad.v[j] : from_f<T>(0.f);
        store<T, V>(dx + image + (r * g.w + col) * g.c, out);
      }
    }
  }
}

// The first of the windows at stride s and kernel k that covers input row (or column) i.
__device__ __forceinline__ int64_t first_window(int64_t i, int k, int s) { return i < k ? 0 : (i - k) / s + 1; }

// Overlapping windows (kernel > stride) or padded ones: one thread per cell and pack of
// channels finds the winners of every window covering its cell and adds dy of those it won, in
// float from +0, in row-major window order: the CPU layer's sum, in the same order, rounded once.
// Window oh covers rows oh * s - pad .. oh * s - pad + k - 1.
template <class T, int V>
__global__ void max_pool_backward_overlap_kernel(const T* x, const T* dy, T* dx, PoolShape g) {
  const int64_t packs = g.c / V, total = g.n * g.h * g.w * packs;
  HPC_GRID_STRIDE(i, total) {
    const int64_t channel = i % packs * V;
    int64_t rest = i / packs;
    const int64_t iw = rest % g.w;
    rest /= g.w;
    const int64_t ih = rest % g.h, b = rest / g.h;
    const int64_t ph = ih + g.pad, pw = iw + g.pad;  // the cell's row and column in the padded image
    const int64_t oh_end = min(ph / g.s + 1, g.ho), ow_end = min(pw / g.s + 1, g.wo);
    const T* image = x + b * g.h * g.w * g.c + channel;
    float acc[V];
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] = 0.f;
    for (int64_t oh = first_window(ph, g.k, g.s); oh < oh_end; ++oh) {
      for (int64_t ow = first_window(pw, g.k, g.s); ow < ow_end; ++ow) {
        int at[V];
        clipped_winners<T, V>(image, oh * g.s - g.pad, ow * g.s - g.pad, g, at);
        const int pos = static_cast<int>((ph - oh * g.s) * g.k + (pw - ow * g.s));
        const Pack<T, V> grad = load<T, V>(dy + ((b * g.ho + oh) * g.wo + ow) * g.c + channel);
#pragma unroll
        for (int j = 0; j < V; ++j)
          if (at[j] == pos) acc[j] += to_f(grad.v[j]);
      }
    }
    Pack<T, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) out.v[j] = from_f<T>(acc[j]);
    store<T, V>(dx + i * V, out);
  }
}

template <class T, int V>
void launch(const T* x, const T* dy, T* dx, const PoolShape& g, cudaStream_t stream) {
  const bool dense = g.k <= g.s && g.pad == 0;
  const int64_t cells = dense ? g.n * g.ho * g.wo : g.n * g.h * g.w;
  const unsigned blocks = blocks_for(cells * (g.c / V));
  if (dense) max_pool_backward_dense_kernel<T, V><<<blocks, kThreads, 0, stream>>>(x, dy, dx, g);
  else max_pool_backward_overlap_kernel<T, V><<<blocks, kThreads, 0, stream>>>(x, dy, dx, g);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void max_pool_backward(DType t, const void* x, const void* dy, void* dx, int64_t n, int64_t h, int64_t w,
                       int64_t channels, int kernel, int stride, int padding, cudaStream_t stream) {
  HPC_CHECK(kernel >= 1 && stride >= 1 && padding >= 0 && 2 * padding <= kernel && h + 2 * padding >= kernel &&
                w + 2 * padding >= kernel && channels >= 1,
            "max_pool_backward: kernel ", kernel, " stride ", stride, " padding ", padding, " on ", h, " x ", w, " x ",
            channels);
  if (n == 0) return;
  const int64_t ho = (h + 2 * padding - kernel) / stride + 1, wo = (w + 2 * padding - kernel) / stride + 1;
  const PoolShape g{n, h, w, channels, ho, wo, kernel, stride, padding};
  with_type(t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kWide = 16 / sizeof(T);  // channels per 128-bit load
    const auto* xt = static_cast<const T*>(x);
    const auto* dyt = static_cast<const T*>(dy);
    auto* dxt = static_cast<T*>(dx);
    const bool wide = channels % kWide == 0 && aligned16(x) && aligned16(dy) && aligned16(dx);
    if (wide) launch<T, kWide>(xt, dyt, dxt, g, stream);
    else launch<T, 1>(xt, dyt, dxt, g, stream);
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace hpc::kernels

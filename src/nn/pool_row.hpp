// One row of non-overlapping or overlapping max-pool windows: the kernel MaxPool2d and batch
// norm's fused pool share, so both pick the same winners with the same tie rule.
#pragma once

#include <algorithm>
#include <cstdint>

namespace hpc::nn {

template <class T>
inline T affine(T x, T scale, T shift) {
  return x * scale + shift;
}

// What a window compares: the input itself (MaxPool2d), or batch norm's output of it,
// x * scale + shift, with or without the ReLU (the fused pool).
enum class Seen { Input, Normalised, NormalisedRelu };

template <Seen S, class T>
inline T seen(T x, T scale, T shift) {
  if constexpr (S == Seen::Input) return x;
  else if constexpr (S == Seen::Normalised) return affine(x, scale, shift);
  else return std::max(affine(x, scale, shift), T(0));
}

// Channel j of cell x as the window sees it; the per-channel scale and shift are read only
// when S uses them (they may be null for Seen::Input).
template <Seen S, class T>
inline T seen_at(const T* __restrict x, const T* __restrict scale, const T* __restrict shift, int64_t j) {
  if constexpr (S == Seen::Input) return x[j];
  else return seen<S>(x[j], scale[j], shift[j]);
}

struct PoolWindows {
  int64_t c, k, s, w, wo;  // channels, window, stride, input width, output width
};

// One row of pooling windows starting at input row xrow: maxima to out, the winners' places
// in their windows to idx (row-major, kh * k + kw). Strict >: the first maximum wins, as
// PyTorch. A function of its own, not a lambda, so every size and pointer is a local the byte
// stores to idx cannot alias (otherwise nothing vectorises).
template <Seen S, class T>
void pool_row(const PoolWindows p, const T* __restrict xrow, const T* __restrict sc, const T* __restrict sh,
              T* __restrict out, uint8_t* __restrict idx) {
  const int64_t c = p.c, k = p.k, w = p.w;
  for (int64_t ow = 0; ow < p.wo; ++ow, out += c, idx += c) {
    const T* __restrict corner = xrow + ow * p.s * c;
    if (k == 2) {  // the common window, unrolled: the running maximum stays in registers
      const T* __restrict right = corner + c;
      const T* __restrict below = corner + w * c;
      const T* __restrict diagonal = below + c;
      for (int64_t j = 0; j < c; ++j) {
        T best = seen_at<S>(corner, sc, sh, j);
        uint8_t at = 0;
        const T v1 = seen_at<S>(right, sc, sh, j);
        if (v1 > best) best = v1, at = 1;
        const T v2 = seen_at<S>(below, sc, sh, j);
        if (v2 > best) best = v2, at = 2;
        const T v3 = seen_at<S>(diagonal, sc, sh, j);
        if (v3 > best) best = v3, at = 3;
        out[j] = best;
        idx[j] = at;
      }
      continue;
    }
    for (int64_t j = 0; j < c; ++j) {
      out[j] = seen_at<S>(corner, sc, sh, j);
      idx[j] = 0;
    }
    for (int64_t kh = 0; kh < k; ++kh) {
      for (int64_t kw = (kh == 0 ? 1 : 0); kw < k; ++kw) {
        const T* __restrict in = corner + (kh * w + kw) * c;
        const auto pos = static_cast<uint8_t>(kh * k + kw);
        for (int64_t j = 0; j < c; ++j) {
          const T v = seen_at<S>(in, sc, sh, j);
          const bool more = v > out[j];
          out[j] = more ? v : out[j];
          idx[j] = more ? pos : idx[j];
        }
      }
    }
  }
}

}  // namespace hpc::nn

// How the GPU tests compare a GPU result with its CPU reference: bounds derived from the
// rounding of the precision the GPU computed in, element by element, relative to the
// magnitudes that made each element. Header-only and free of CUDA, so that a CPU test
// (tests/unit/compare_test.cpp) proves each helper fails on planted errors: one wrong
// channel, a gradient scaled by 0.9, a transposed product (DESIGN.md: every checker deserves
// the proof gradcheck_test gives the gradient checker).
//
// The model of the error: a value computed in precision p through `roundings` successive
// roundings (an operand rounded to p, a product's sum, a result stored in p) is off from the
// exact value by at most about roundings * u(p) times the magnitude of the terms that made it
// (Higham, Accuracy and Stability of Numerical Algorithms, ch. 3: |fl(a.b) - a.b| <= gamma_n |a|.|b|).
// Where those terms are at hand (a product) the bound uses them; where they are not (the
// output of a whole network) it uses the element's own magnitude plus the tensor's root mean
// square, which stands in for what cancelled. Rounding to nearest is unbiased, so the
// least-squares scale of a result on its reference stays within about u(p) sqrt(roundings)
// of 1 even where the element bounds are loose: that second check catches a uniformly scaled
// gradient.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

namespace hpc::testing {

enum class Precision { Fp32, Tf32, Bf16, Fp16 };

// The unit roundoff u = 2^-(mantissa bits + 1) of each precision's storage or products: fp32
// 24 bits, TF32 tensor-core products and fp16 11, bf16 8. cuDNN's fp32 convolutions may use
// Winograd or FFT algorithms that lose a few bits more than a plain sum: fp32 gets 2^-20.
inline double unit_roundoff(Precision p) {
  switch (p) {
    case Precision::Fp32: return std::ldexp(1.0, -20);
    case Precision::Tf32: return std::ldexp(1.0, -11);
    case Precision::Bf16: return std::ldexp(1.0, -8);
    case Precision::Fp16: return std::ldexp(1.0, -11);
  }
  return 1;
}

inline const char* name_of(Precision p) {
  static const char* const kNames[] = {"fp32", "tf32", "bf16", "fp16"};
  return kNames[static_cast<int>(p)];
}

// IEEE binary16 by hand (the GPU machine's compiler may predate GCC 12's _Float16 on x86):
// the bits of x rounded to nearest even (gradual underflow, overflow to infinity, NaN kept),
// and the value of such bits. compare_test checks both against _Float16 where it exists.
inline uint16_t fp16_bits(float x) {
  uint32_t f;
  std::memcpy(&f, &x, sizeof f);
  const auto sign = static_cast<uint16_t>((f >> 16) & 0x8000u);
  const uint32_t a = f & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // 65520 and up round to infinity
  if (a < 0x38800000u) {                        // below 2^-14: a multiple of 2^-24, rounded
    const double units = std::nearbyint(static_cast<double>(std::fabs(x)) * 16777216.0);  // to even
    return sign | static_cast<uint16_t>(units);  // 1024 units is the smallest normal's encoding
  }
  uint32_t h = a - 0x38000000u;  // exponent rebiased from 127 to 15
  h += 0xfffu + ((h >> 13) & 1u);
  return sign | static_cast<uint16_t>(h >> 13);
}
inline float fp16_value(uint16_t h) {
  const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  const float v = e == 0 ? std::ldexp(static_cast<float>(m), -24)
                  : e == 31 ? (m ? NAN : INFINITY)
                            : std::ldexp(static_cast<float>(m | 0x400), e - 25);
  return (h & 0x8000u) ? -v : v;
}

// x rounded to precision p, to nearest even (the CPU reference of a conversion kernel): fp16
// as above; bf16 and TF32 by clearing low mantissa bits with rounding, NaN kept a NaN.
inline float round_to(Precision p, float x) {
  if (p == Precision::Fp32) return x;
  if (p == Precision::Fp16) return fp16_value(fp16_bits(x));
  if (std::isnan(x)) return x;
  const int drop = p == Precision::Bf16 ? 16 : 13;
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const uint32_t half = (1u << (drop - 1)) - 1 + ((bits >> drop) & 1u);
  bits = (bits + half) & ~((1u << drop) - 1);
  float r;
  std::memcpy(&r, &bits, sizeof r);
  return r;
}

// The relative bound of a value that went through `roundings` roundings in precision p.
inline double rounding_bound(Precision p, double roundings) { return 2 * roundings * unit_roundoff(p); }

// For C = A (m x k) times B (k x n), row-major: sum_l |A_il| |B_lj| for each C_ij, the
// magnitude of the terms whose rounding makes the product's error.
inline std::vector<double> product_magnitudes(const float* a, const float* b, int64_t m, int64_t k, int64_t n) {
  std::vector<double> s(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t l = 0; l < k; ++l) {
      const double ail = std::fabs(a[i * k + l]);
      for (int64_t j = 0; j < n; ++j) s[static_cast<size_t>(i * n + j)] += ail * std::fabs(b[l * n + j]);
    }
  return s;
}

// Where the terms are not at hand: |want_i| plus the root mean square of want.
inline std::vector<double> value_magnitudes(const float* want, int64_t n) {
  double sq = 0;
  for (int64_t i = 0; i < n; ++i) sq += static_cast<double>(want[i]) * want[i];
  const double rms = n > 0 ? std::sqrt(sq / static_cast<double>(n)) : 0.0;
  std::vector<double> s(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) s[static_cast<size_t>(i)] = std::fabs(want[i]) + rms;
  return s;
}

// |got_i - want_i| <= bound * scale_i for every i (a NaN anywhere fails). On failure: how
// many elements are out, the first few with their index (and channel, where the innermost
// dimension has `channels` entries), and the bound that the worst one would need.
inline ::testing::AssertionResult within_elementwise(const float* got, const float* want, const double* scale,
                                                     int64_t n, double bound, int64_t channels = 1) {
  int64_t bad = 0;
  double worst = 0;
  std::ostringstream first;
  for (int64_t i = 0; i < n; ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double need = scale[i] > 0 ? err / scale[i] : (err > 0 ? INFINITY : 0.0);
    if (!(err <= bound * scale[i])) {
      if (bad < 5)
        first << "\n  [" << i << "]" << (channels > 1 ? " channel " + std::to_string(i % channels) : "")
              << ": got " << got[i] << ", want " << want[i] << " (error " << err << ", allowed " << bound * scale[i]
              << ")";
      ++bad;
    }
    if (!(need <= worst)) worst = need;  // NaN becomes the worst
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << n << " elements beyond " << bound
                                       << " x their magnitude (the worst needs " << worst << ")" << first.str();
}

// The least-squares scale of got on want, <got, want> / <want, want> (1 where want is zero).
inline double least_squares_scale(const float* got, const float* want, int64_t n) {
  double gw = 0, ww = 0;
  for (int64_t i = 0; i < n; ++i) {
    gw += static_cast<double>(got[i]) * want[i];
    ww += static_cast<double>(want[i]) * want[i];
  }
  return ww == 0 ? 1.0 : gw / ww;
}

// The least-squares scale of got on want is within tol of 1.
inline ::testing::AssertionResult same_scale(const float* got, const float* want, int64_t n, double tol) {
  const double s = least_squares_scale(got, want, n);
  if (std::fabs(s - 1) <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "scaled by " << s << " against the reference (allowed 1 +- " << tol << ")";
}

// A tensor computed in precision p through `roundings` roundings, against its reference: every
// element within rounding_bound of its magnitude (value_magnitudes), and the whole not scaled.
inline ::testing::AssertionResult matches(const float* got, const float* want, int64_t n, Precision p,
                                          double roundings, int64_t channels = 1) {
  const std::vector<double> scale = value_magnitudes(want, n);
  auto each = within_elementwise(got, want, scale.data(), n, rounding_bound(p, roundings), channels);
  if (!each) return each << " [" << name_of(p) << ", " << roundings << " roundings]";
  auto whole = same_scale(got, want, n, 2 * unit_roundoff(p) * std::sqrt(roundings) + 1e-6);
  if (!whole) return whole << " [" << name_of(p) << ", " << roundings << " roundings]";
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult matches(const std::vector<float>& got, const std::vector<float>& want, Precision p,
                                          double roundings, int64_t channels = 1) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << got.size() << " elements, want " << want.size();
  return matches(got.data(), want.data(), static_cast<int64_t>(got.size()), p, roundings, channels);
}

// A network's parameter gradients against their reference. Two things move them by more than
// the rounding of their own magnitude: a ReLU or a max pool whose input lies within the
// forward pass's rounding of its threshold takes the other branch, which moves every gradient
// upstream of it by about 1/sqrt(its terms); and a gradient that is zero in exact arithmetic
// (a bias just before a batch norm) is the rounding of terms far larger than itself. Neither
// is bounded by the value, so both are measured: each of `runs` is the same computation on
// inputs and parameters perturbed by up to one unit roundoff of p (each operand rounded as it
// could have been), which moves the forward pass about as far as its own rounding does, so
// the runs take other branches and round other ways; `reference_runs` are the reference's
// computation on the same perturbed inputs. The spread is the largest distance between two
// of {got, runs}, or between two of {want, reference_runs}, relative to each element's
// magnitude (value_magnitudes). Both sides count because a branch can be taken by either:
// on an H200, mlp_no_bn's TF32 pass took a ReLU's other side in got and in all three of its
// runs, against the CPU; the CPU's own runs, perturbed alike, cross there too. got passes if
// every element is within max(the rounding bound, factor x spread) of its reference, and its
// scale on the reference within the largest of the rounding tolerance, factor x the largest
// difference of scale within either side, and factor x the scale's uncertainty that the
// spread implies (each element moved by the spread in a random direction). A fault of the
// code under test (a wrong channel, a missing factor) is in got and all its runs alike and in
// no reference run: the spread stays small and the fault is caught (compare_test plants
// both). What this cannot catch is a got that alone is wrong; got and its runs come from the
// same deterministic code, which train_gpu_test checks repeats bit for bit.
struct Spread {
  double element = 0;  // max over pairs and elements of |a_i - b_i| / magnitude_i
  double scale = 0;    // max over pairs of the difference of their scales on want
};

inline Spread spread_of(const float* want, int64_t n, const std::vector<const float*>& runs) {
  const std::vector<double> magnitude = value_magnitudes(want, n);
  std::vector<double> scales;
  for (const float* run : runs) scales.push_back(least_squares_scale(run, want, n));
  Spread sp;
  for (size_t a = 0; a < runs.size(); ++a)
    for (size_t b = a + 1; b < runs.size(); ++b) {
      for (int64_t i = 0; i < n; ++i) {
        const double diff = std::fabs(static_cast<double>(runs[a][i]) - runs[b][i]);
        const double d = diff == 0 ? 0.0 : diff / magnitude[static_cast<size_t>(i)];  // 0/0: equal
        if (!(d <= sp.element)) sp.element = d;  // a NaN stays
      }
      const double ds = std::fabs(scales[a] - scales[b]);
      if (!(ds <= sp.scale)) sp.scale = ds;
    }
  return sp;
}

// The spread matches_within_spread allows: the larger of the spreads among got and its runs
// and among want and the reference's runs (none: got's side alone).
inline Spread spread_around(const float* got, const float* want, int64_t n, const std::vector<const float*>& runs,
                            const std::vector<const float*>& reference_runs) {
  std::vector<const float*> mine{got}, reference{want};
  mine.insert(mine.end(), runs.begin(), runs.end());
  reference.insert(reference.end(), reference_runs.begin(), reference_runs.end());
  const Spread a = spread_of(want, n, mine), b = spread_of(want, n, reference);
  auto larger = [](double x, double y) { return std::isnan(x) || std::isnan(y) ? NAN : std::max(x, y); };
  return {larger(a.element, b.element), larger(a.scale, b.scale)};
}

inline ::testing::AssertionResult matches_within_spread(const float* got, const float* want, int64_t n,
                                                        const std::vector<const float*>& runs, Precision p,
                                                        double roundings, int64_t channels = 1,
                                                        double factor = 3,
                                                        const std::vector<const float*>& reference_runs = {}) {
  if (runs.empty()) return ::testing::AssertionFailure() << "a spread needs a perturbed run or more";
  const Spread sp = spread_around(got, want, n, runs, reference_runs);
  if (std::isnan(sp.element) || std::isnan(sp.scale))
    return ::testing::AssertionFailure() << "a perturbed run gave a NaN";
  const std::vector<double> magnitude = value_magnitudes(want, n);
  const double bound = std::max(rounding_bound(p, roundings), factor * sp.element);
  std::ostringstream why;
  why << " [" << name_of(p) << ", " << roundings << " roundings, " << runs.size() << " runs' spread "
      << sp.element << ", scale " << sp.scale << "]";
  auto each = within_elementwise(got, want, magnitude.data(), n, bound, channels);
  if (!each) return each << why.str();
  // The scale's own uncertainty where each element may move by the spread, in random
  // directions: spread x sqrt(sum want_i^2 magnitude_i^2) / sum want_i^2.
  double wm = 0, ww = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double w = want[i];
    wm += w * w * magnitude[static_cast<size_t>(i)] * magnitude[static_cast<size_t>(i)];
    ww += w * w;
  }
  const double implied = ww > 0 ? sp.element * std::sqrt(wm) / ww : 0.0;
  const double tol =
      std::max({2 * unit_roundoff(p) * std::sqrt(roundings) + 1e-6, factor * sp.scale, factor * implied});
  auto whole = same_scale(got, want, n, tol);
  if (!whole) return whole << why.str();
  return ::testing::AssertionSuccess();
}

// C = A (m x k) B (k x n), row-major, accumulated in double and rounded once: the reference.
inline std::vector<float> exact_product(const float* a, const float* b, int64_t m, int64_t k, int64_t n) {
  std::vector<float> c(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t l = 0; l < k; ++l) s += static_cast<double>(a[i * k + l]) * b[l * n + j];
      c[static_cast<size_t>(i * n + j)] = static_cast<float>(s);
    }
  return c;
}

// The transpose of a row-major rows x cols matrix.
inline std::vector<float> transposed(const float* a, int64_t rows, int64_t cols) {
  std::vector<float> t(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) t[static_cast<size_t>(j * rows + i)] = a[i * cols + j];
  return t;
}

// A product computed in precision p (operands rounded to p, sums of k terms in float): every
// element within (2 + k u(fp32)/u(p)) roundings of its terms' magnitude.
inline ::testing::AssertionResult product_matches(const float* got, const float* want, const float* a, const float* b,
                                                  int64_t m, int64_t k, int64_t n, Precision p) {
  const std::vector<double> scale = product_magnitudes(a, b, m, k, n);
  const double roundings = 2 + static_cast<double>(k) * std::ldexp(1.0, -24) / unit_roundoff(p);
  return within_elementwise(got, want, scale.data(), m * n, rounding_bound(p, roundings));
}

}  // namespace hpc::testing

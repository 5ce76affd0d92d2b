// The GPU tests' comparison helpers (tests/gpu/compare.hpp), proven on the CPU: each passes a
// result that differs from its reference only by the precision's rounding, and fails on the
// planted errors a wrong kernel makes: one wrong channel, a gradient scaled by 0.9, a
// transposed product. Each planted error is tried at the loosest setting the GPU tests use.
#include "gpu/compare.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

namespace hpc::testing {
namespace {

const Precision kAll[] = {Precision::Fp32, Precision::Tf32, Precision::Bf16, Precision::Fp16};
// The most roundings network_test allows (gradients of the deepest variant): the loosest bound.
constexpr double kLoosest = 120;

std::vector<float> normal(size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0, 1);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

std::vector<float> rounded(Precision p, std::vector<float> v) {
  for (float& x : v) x = round_to(p, x);
  return v;
}

// The product as a tensor-core GEMM in precision p does it: operands rounded, sums in float.
std::vector<float> product_in(Precision p, const std::vector<float>& a, const std::vector<float>& b, int64_t m,
                              int64_t k, int64_t n) {
  std::vector<float> c(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float s = 0;
      for (int64_t l = 0; l < k; ++l) s += round_to(p, a[i * k + l]) * round_to(p, b[l * n + j]);
      c[static_cast<size_t>(i * n + j)] = round_to(p == Precision::Tf32 ? Precision::Fp32 : p, s);
    }
  return c;
}

TEST(RoundTo, RoundsToNearestEven) {
  EXPECT_EQ(round_to(Precision::Bf16, 1.f + 0x1p-8f), 1.f);                  // a tie: to even
  EXPECT_EQ(round_to(Precision::Bf16, 1.f + 3 * 0x1p-8f), 1.f + 0x1p-6f);    // a tie: up to even
  EXPECT_EQ(round_to(Precision::Bf16, 1.f + 0x1p-8f + 0x1p-20f), 1.f + 0x1p-7f);
  EXPECT_EQ(round_to(Precision::Tf32, 1.f + 0x1p-11f), 1.f);
  EXPECT_EQ(round_to(Precision::Tf32, 1.f + 0x1p-11f + 0x1p-20f), 1.f + 0x1p-10f);
  EXPECT_EQ(round_to(Precision::Fp16, 1.f + 0x1p-11f), 1.f);
  EXPECT_EQ(round_to(Precision::Fp16, 70000.f), INFINITY);  // beyond fp16's 65504
  EXPECT_EQ(round_to(Precision::Bf16, 3.3895313e38f), 3.3895313e38f);  // bf16's largest
  EXPECT_EQ(round_to(Precision::Bf16, 3.4e38f), INFINITY);
  EXPECT_TRUE(std::isnan(round_to(Precision::Bf16, NAN)));
}

// The hand-made binary16 against GCC's _Float16 (where this compiler has it): every 16-bit
// pattern's value, and the rounding of floats across the whole range, ties, subnormals and
// the overflow edge included.
TEST(RoundTo, Fp16ByHandEqualsFloat16) {
#if defined(__FLT16_MAX__)
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    _Float16 h;
    const auto bits = static_cast<uint16_t>(b);
    std::memcpy(&h, &bits, sizeof h);
    const float want = static_cast<float>(h), got = fp16_value(bits);
    ASSERT_TRUE(std::isnan(want) ? std::isnan(got) : std::memcmp(&want, &got, 4) == 0) << std::hex << b;
  }
  std::mt19937 g(9);
  std::vector<float> xs = {0.f, -0.f, 65504.f, 65519.99f, 65520.f, 65536.f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f,
                           0x1p-14f, 0x1.ffcp-15f, 0x1.ffep-15f, 1.f + 0x1p-11f, 1.f + 0x1.8p-10f, INFINITY, NAN};
  for (int i = 0; i < 200000; ++i) {
    const uint32_t bits = g();
    float x;
    std::memcpy(&x, &bits, sizeof x);
    xs.push_back(x);
    xs.push_back(std::ldexp(static_cast<float>(g() % 100000) / 1000.f, static_cast<int>(g() % 50) - 30));
  }
  for (float x : xs) {
    const _Float16 h = static_cast<_Float16>(x);
    uint16_t want;
    std::memcpy(&want, &h, sizeof want);
    const uint16_t got = fp16_bits(x);
    if (std::isnan(x)) ASSERT_TRUE(std::isnan(fp16_value(got))) << x;
    else ASSERT_EQ(got, want) << std::hexfloat << x;
  }
#else
  GTEST_SKIP() << "this compiler has no _Float16 to compare with";
#endif
}

TEST(Compare, RoundingNoiseOfEachPrecisionPasses) {
  const auto want = normal(4096, 1);
  for (Precision p : kAll) {
    SCOPED_TRACE(name_of(p));
    EXPECT_TRUE(matches(rounded(p, want), want, p, 1));
    // A value near zero where the tensor's others are not: its magnitude is the tensor's scale.
    auto near_zero = want;
    near_zero[7] = 1e-7f;
    auto got = rounded(p, near_zero);
    got[7] = 2e-3f * static_cast<float>(unit_roundoff(p) / unit_roundoff(Precision::Bf16));
    EXPECT_TRUE(matches(got, near_zero, p, 1));
  }
}

TEST(Compare, ANanFails) {
  const auto want = normal(100, 2);
  auto got = want;
  got[50] = NAN;
  EXPECT_FALSE(matches(got, want, Precision::Bf16, kLoosest));
}

// An NHWC activation of 8 channels whose channel 3 came from the wrong place (another
// channel's values): every precision, at the loosest bound, fails and names the channel.
TEST(Compare, OneWrongChannelFails) {
  const int64_t channels = 8;
  const auto want = normal(64 * channels, 3);
  for (Precision p : kAll) {
    SCOPED_TRACE(name_of(p));
    auto got = rounded(p, want);
    for (size_t i = 3; i < got.size(); i += channels) got[i] = want[i + 1];
    const auto r = matches(got, want, p, kLoosest, channels);
    EXPECT_FALSE(r);
    EXPECT_NE(std::string(r.message()).find("channel 3"), std::string::npos) << r.message();
    // The same tensor with the channel right passes: the failure is the channel's.
    EXPECT_TRUE(matches(rounded(p, want), want, p, kLoosest, channels));
  }
}

// A gradient 10% too small (a missing factor, a wrong loss scale): inside the loosest element
// bound of bf16, caught by the scale check in every precision.
TEST(Compare, AGradientScaledBy0_9Fails) {
  const auto want = normal(2000, 4);
  for (Precision p : kAll) {
    SCOPED_TRACE(name_of(p));
    auto got = rounded(p, want);
    for (float& g : got) g *= 0.9f;
    EXPECT_FALSE(matches(got, want, p, kLoosest));
    EXPECT_FALSE(same_scale(got.data(), want.data(), static_cast<int64_t>(got.size()),
                            2 * unit_roundoff(p) * std::sqrt(kLoosest)));
  }
}

// A product computed with one operand transposed (a wrong layout or cuBLAS op flag) fails
// the product's bound; the right product, in each precision's GEMM arithmetic, passes it.
TEST(Compare, ATransposedProductFails) {
  const int64_t k = 48;
  const auto a = normal(static_cast<size_t>(k * k), 5), b = normal(static_cast<size_t>(k * k), 6);
  const auto at = transposed(a.data(), k, k);
  const auto want = exact_product(a.data(), b.data(), k, k, k);
  for (Precision p : kAll) {
    SCOPED_TRACE(name_of(p));
    const auto right = product_in(p, a, b, k, k, k);
    EXPECT_TRUE(product_matches(right.data(), want.data(), a.data(), b.data(), k, k, k, p));
    const auto transposed = product_in(p, at, b, k, k, k);
    EXPECT_FALSE(product_matches(transposed.data(), want.data(), a.data(), b.data(), k, k, k, p));
  }
}

// What matches_within_spread admits and what it still catches. `noisy` is want moved by
// Gaussian noise of `size` times each element's magnitude (|want_i| + rms), as a branch taken
// the other way moves every gradient upstream of it.
std::vector<float> noisy(const std::vector<float>& want, double size, unsigned seed) {
  const std::vector<double> m = value_magnitudes(want.data(), static_cast<int64_t>(want.size()));
  auto z = normal(want.size(), seed);
  std::vector<float> v(want.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(want[i] + size * m[i] * z[i]);
  return v;
}

struct Runs {
  std::vector<std::vector<float>> data;
  std::vector<const float*> pointers() const {
    std::vector<const float*> p;
    for (const auto& d : data) p.push_back(d.data());
    return p;
  }
};

// Three runs that differ from want as much as got does: got passes, in every precision at
// the tightest bound (1 rounding), though fp32's rounding bound alone refuses it.
TEST(CompareSpread, AResultAsFarAsItsPerturbedRunsPasses) {
  const auto want = normal(2000, 11);
  const auto got = noisy(want, 0.02, 12);
  Runs runs{{noisy(want, 0.02, 13), noisy(want, 0.02, 14), noisy(want, 0.02, 15)}};
  const int64_t n = static_cast<int64_t>(want.size());
  EXPECT_FALSE(matches(got, want, Precision::Fp32, kLoosest));
  for (Precision p : kAll) {
    SCOPED_TRACE(name_of(p));
    EXPECT_TRUE(matches_within_spread(got.data(), want.data(), n, runs.pointers(), p, 1));
  }
  // Runs equal to got: no spread, the rounding bound alone decides.
  Runs same{{got, got}};
  EXPECT_FALSE(matches_within_spread(got.data(), want.data(), n, same.pointers(), Precision::Fp32, kLoosest));
}

// A gradient that is zero in exact arithmetic: the reference is float noise, got and the runs
// are the GPU precision's noise, a thousand times larger, and pass; an offset that got and
// every run share (a sum that forgot to subtract its mean), far beyond that noise, fails.
TEST(CompareSpread, AnExactZeroGradientIsJudgedByTheRunsNoise) {
  auto want = normal(64, 21);
  for (float& w : want) w *= 1e-9f;
  auto at = [](unsigned seed, float offset) {
    auto v = normal(64, seed);
    for (float& x : v) x = x * 1e-6f + offset;
    return v;
  };
  const auto got = at(22, 0);
  Runs runs{{at(23, 0), at(24, 0), at(25, 0)}};
  EXPECT_FALSE(matches(got, want, Precision::Bf16, kLoosest));
  EXPECT_TRUE(matches_within_spread(got.data(), want.data(), 64, runs.pointers(), Precision::Bf16, kLoosest));
  const auto off = at(22, 1e-4f);
  Runs off_runs{{at(23, 1e-4f), at(24, 1e-4f), at(25, 1e-4f)}};
  EXPECT_FALSE(
      matches_within_spread(off.data(), want.data(), 64, off_runs.pointers(), Precision::Bf16, kLoosest));
}

// Faults the runs share, as a wrong kernel gives every run: one wrong channel (named), and a
// gradient scaled by 0.9, each at the loosest setting, fail in every precision.
TEST(CompareSpread, AFaultTheRunsShareFails) {
  const int64_t channels = 8;
  const auto want = normal(256 * channels, 31);
  const int64_t n = static_cast<int64_t>(want.size());
  auto wrong_channel = [&](std::vector<float> v) {
    for (size_t i = 3; i + 1 < v.size(); i += channels) v[i] = want[i + 1];
    return v;
  };
  auto scaled = [](std::vector<float> v) {
    for (float& x : v) x *= 0.9f;
    return v;
  };
  for (Precision p : kAll) {
    SCOPED_TRACE(name_of(p));
    const auto base = noisy(want, 0.02, 32);
    Runs base_runs{{noisy(want, 0.02, 33), noisy(want, 0.02, 34), noisy(want, 0.02, 35)}};
    EXPECT_TRUE(matches_within_spread(base.data(), want.data(), n, base_runs.pointers(), p, kLoosest, channels));

    Runs bad{{wrong_channel(base_runs.data[0]), wrong_channel(base_runs.data[1]), wrong_channel(base_runs.data[2])}};
    const auto got = wrong_channel(base);
    const auto r = matches_within_spread(got.data(), want.data(), n, bad.pointers(), p, kLoosest, channels);
    EXPECT_FALSE(r);
    EXPECT_NE(std::string(r.message()).find("channel 3"), std::string::npos) << r.message();

    Runs small{{scaled(base_runs.data[0]), scaled(base_runs.data[1]), scaled(base_runs.data[2])}};
    const auto got_small = scaled(base);
    EXPECT_FALSE(matches_within_spread(got_small.data(), want.data(), n, small.pointers(), p, kLoosest, channels));
  }
}

// The reference itself at a branch: got and its runs agree with one another, the reference
// took the other side of a ReLU (its elements moved by 5% of their magnitude). Its own
// perturbed runs, some of which take got's side, show that sensitivity: with them got
// passes, without them it fails. A fault in got and its runs is still caught with them.
TEST(CompareSpread, AReferenceAtABranchIsJudgedByItsOwnRuns) {
  const auto exact = normal(2000, 51);
  const auto got = noisy(exact, 0.002, 52);
  Runs runs{{noisy(exact, 0.002, 53), noisy(exact, 0.002, 54), noisy(exact, 0.002, 55)}};
  const auto want = noisy(exact, 0.05, 56);
  Runs reference_runs{{noisy(exact, 0.002, 57), noisy(want, 0.002, 58), noisy(exact, 0.002, 59)}};
  const int64_t n = static_cast<int64_t>(exact.size());
  EXPECT_FALSE(matches_within_spread(got.data(), want.data(), n, runs.pointers(), Precision::Tf32, 18));
  EXPECT_TRUE(matches_within_spread(got.data(), want.data(), n, runs.pointers(), Precision::Tf32, 18, 1, 3,
                                    reference_runs.pointers()));
  auto scaled = [](std::vector<float> v) {
    for (float& x : v) x *= 0.9f;
    return v;
  };
  const auto bad = scaled(got);
  Runs bad_runs{{scaled(runs.data[0]), scaled(runs.data[1]), scaled(runs.data[2])}};
  EXPECT_FALSE(matches_within_spread(bad.data(), want.data(), n, bad_runs.pointers(), Precision::Tf32, 18, 1, 3,
                                     reference_runs.pointers()));
}

TEST(CompareSpread, ANanInARunFails) {
  const auto want = normal(100, 41);
  auto run = want;
  run[10] = NAN;
  Runs runs{{want, run}};
  EXPECT_FALSE(matches_within_spread(want.data(), want.data(), 100, runs.pointers(), Precision::Bf16, kLoosest));
  Runs none;
  EXPECT_FALSE(matches_within_spread(want.data(), want.data(), 100, none.pointers(), Precision::Bf16, kLoosest));
}

}  // namespace
}  // namespace hpc::testing

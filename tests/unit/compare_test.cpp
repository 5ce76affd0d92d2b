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

}  // namespace
}  // namespace hpc::testing

// Philox (counter-based randomness) and the ShardedSampler built on it (DESIGN.md principle 5).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <set>
#include <vector>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "data/sampler.hpp"

namespace hpc {
namespace {

std::vector<uint32_t> draw(Philox rng, int n) {
  std::vector<uint32_t> v(n);
  for (auto& x : v) x = rng.next_u32();
  return v;
}

int64_t equal_positions(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
  int64_t same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += a[i] == b[i];
  return same;
}

// ---- Philox ----------------------------------------------------------------------------------

// Known answer of Philox4x32-10 (Random123's kat_vectors): counter 0 and key 0. Seed 0 with
// stream 0 and position (0, 0) puts zeros in both.
TEST(Philox, KnownAnswerForZeroKeyAndCounter) {
  Philox rng(0, static_cast<RngStream>(0), 0, 0);
  EXPECT_EQ(rng.next_u32(), 0x6627e8d5u);
  EXPECT_EQ(rng.next_u32(), 0xe169c58du);
  EXPECT_EQ(rng.next_u32(), 0xbc57ac4cu);
  EXPECT_EQ(rng.next_u32(), 0x9b00dbd8u);
}

TEST(Philox, SameKeyAndCounterGiveSameSequence) {
  for (uint64_t seed : {0ull, 1ull, 0xdeadbeefcafeull}) {
    const auto a = draw(Philox(seed, RngStream::Augment, 3, 77), 1000);
    const auto b = draw(Philox(seed, RngStream::Augment, 3, 77), 1000);
    EXPECT_EQ(a, b);
  }
}

// Changing any one of seed, stream, a or b gives an unrelated sequence.
TEST(Philox, SeedStreamAndCounterAreIndependent) {
  const int n = 4096;
  const auto base = draw(Philox(7, RngStream::Shuffle, 2, 5), n);
  const std::vector<std::vector<uint32_t>> others{
      draw(Philox(8, RngStream::Shuffle, 2, 5), n),       draw(Philox(7ull << 32, RngStream::Shuffle, 2, 5), n),
      draw(Philox(7, RngStream::Augment, 2, 5), n),       draw(Philox(7, RngStream::Init, 2, 5), n),
      draw(Philox(7, RngStream::Shuffle, 3, 5), n),       draw(Philox(7, RngStream::Shuffle, 2, 6), n),
      draw(Philox(7, RngStream::Shuffle, 2, 5ull << 32), n), draw(Philox(7, RngStream::Shuffle, 5, 2), n),
      draw(Philox(7, RngStream::Shuffle, 2ull << 32, 5), n),
      // Only the high 32 bits of a or b differ.
      draw(Philox(7, RngStream::Shuffle, 2 + (1ull << 32), 5), n), draw(Philox(7, RngStream::Shuffle, 2, 5 + (1ull << 32)), n),
      draw(Philox(7 + (1ull << 32), RngStream::Shuffle, 2, 5), n)};
  for (size_t i = 0; i < others.size(); ++i) {
    EXPECT_LE(equal_positions(base, others[i]), 2) << "variant " << i;
    for (size_t j = i + 1; j < others.size(); ++j) EXPECT_LE(equal_positions(others[i], others[j]), 2) << i << "," << j;
  }
  // The values of one sequence are not repeated either (a stuck counter would repeat blocks).
  std::set<uint32_t> distinct(base.begin(), base.end());
  EXPECT_GE(distinct.size(), base.size() - 2);
}

// Samples of the (seed, epoch, index) grid the augmentation uses are pairwise different.
TEST(Philox, SampleStreamsDoNotCollide) {
  std::set<std::vector<uint32_t>> seen;
  for (uint64_t seed : {1, 2})
    for (uint64_t epoch = 0; epoch < 8; ++epoch)
      for (uint64_t index = 0; index < 64; ++index)
        EXPECT_TRUE(seen.insert(draw(Philox(seed, RngStream::Augment, epoch, index), 4)).second)
            << seed << "/" << epoch << "/" << index;
}

TEST(Philox, UniformIsInUnitIntervalWithMeanOneHalf) {
  Philox rng(3, RngStream::Test);
  const int n = 200000;
  double sum = 0, sumd = 0, lo = 1, hi = 0;
  int bins[10] = {};
  for (int i = 0; i < n; ++i) {
    const float u = rng.uniform();
    const double d = rng.uniform_double();
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    ASSERT_GE(d, 0.0);
    ASSERT_LT(d, 1.0);
    sum += u;
    sumd += d;
    lo = std::min(lo, d);
    hi = std::max(hi, d);
    ++bins[static_cast<int>(d * 10)];
  }
  const double sigma = std::sqrt(1.0 / 12 / n);
  EXPECT_NEAR(sum / n, 0.5, 5 * sigma);
  EXPECT_NEAR(sumd / n, 0.5, 5 * sigma);
  EXPECT_LT(lo, 1e-4);
  EXPECT_GT(hi, 1 - 1e-4);
  for (int b : bins) EXPECT_NEAR(b, n / 10, 5 * std::sqrt(n * 0.1 * 0.9));
}

TEST(Philox, UniformDoubleUsesAllLowBits) {
  // 53 random bits: d * 2^53 is an integer whose lowest bit is random (with 24 bits, or a
  // float's worth, it would always be even).
  Philox rng(4, RngStream::Test);
  int fine = 0;
  for (int i = 0; i < 100; ++i) {
    const double scaled = rng.uniform_double() * 1073741824.0 * 8388608.0;  // 2^53
    fine += std::fmod(scaled, 2.0) != 0.0;
  }
  EXPECT_GT(fine, 20);
}

TEST(Philox, NormalHasUnitVariance) {
  Philox rng(5, RngStream::Test);
  const int n = 100000;
  double s = 0, s2 = 0;
  for (int i = 0; i < n; ++i) {
    const double z = rng.normal();
    ASSERT_TRUE(std::isfinite(z));
    s += z;
    s2 += z * z;
  }
  EXPECT_NEAR(s / n, 0.0, 5 / std::sqrt(n));
  EXPECT_NEAR(s2 / n, 1.0, 5 * std::sqrt(2.0 / n));
}

TEST(Philox, BelowStaysBelowAndIsUniform) {
  Philox rng(6, RngStream::Test);
  for (uint32_t n : {1u, 2u, 3u, 7u, 10u, 1000u, 0x80000001u, 0xffffffffu}) {
    for (int i = 0; i < 2000; ++i) ASSERT_LT(rng.below(n), n) << "n = " << n;
  }
  // Chi-square over ten values: 9 degrees of freedom, 40 is far in the tail (p < 1e-5).
  const int draws = 100000;
  std::vector<int> counts(10, 0);
  for (int i = 0; i < draws; ++i) ++counts[rng.below(10)];
  double chi2 = 0;
  for (int c : counts) chi2 += (c - draws / 10.0) * (c - draws / 10.0) / (draws / 10.0);
  EXPECT_LT(chi2, 40.0);
}

// With n = 3 * 2^30, taking next_u32() % n would return [0, 2^30) half of the time;
// unbiased, it is a third.
TEST(Philox, BelowHasNoModuloBias) {
  Philox rng(7, RngStream::Test);
  const uint32_t n = 3u << 30;
  const int draws = 60000;
  int low = 0;
  for (int i = 0; i < draws; ++i) low += rng.below(n) < (1u << 30);
  EXPECT_NEAR(static_cast<double>(low) / draws, 1.0 / 3, 0.01);
}

// ---- epoch_permutation -----------------------------------------------------------------------

bool is_permutation_of_iota(std::vector<uint32_t> p) {
  std::sort(p.begin(), p.end());
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i] != i) return false;
  return true;
}

TEST(EpochPermutation, IsAPermutation) {
  for (uint32_t n : {0u, 1u, 2u, 3u, 100u, 60000u}) {
    const auto p = epoch_permutation(1, 0, n);
    EXPECT_EQ(p.size(), n);
    EXPECT_TRUE(is_permutation_of_iota(p)) << "n = " << n;
  }
}

TEST(EpochPermutation, DeterministicAndDifferentPerEpochAndSeed) {
  const auto a = epoch_permutation(1, 0, 1000);
  EXPECT_EQ(a, epoch_permutation(1, 0, 1000));
  const auto b = epoch_permutation(1, 1, 1000);
  const auto c = epoch_permutation(2, 0, 1000);
  EXPECT_NE(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(b, c);
  // Unrelated, not merely different: few fixed points between them (about one expected).
  int64_t same_ab = 0, same_ac = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    same_ab += a[i] == b[i];
    same_ac += a[i] == c[i];
  }
  EXPECT_LT(same_ab, 10);
  EXPECT_LT(same_ac, 10);
  // And it shuffles: not the identity.
  std::vector<uint32_t> iota(1000);
  std::iota(iota.begin(), iota.end(), 0u);
  EXPECT_NE(a, iota);
}

// Fisher-Yates done right gives each of the 3! orders with probability 1/6.
TEST(EpochPermutation, AllOrdersEquallyLikely) {
  std::map<std::vector<uint32_t>, int> counts;
  const int epochs = 6000;
  for (int e = 0; e < epochs; ++e) ++counts[epoch_permutation(9, e, 3)];
  ASSERT_EQ(counts.size(), 6u);
  for (const auto& [perm, c] : counts) EXPECT_NEAR(c, epochs / 6, 5 * std::sqrt(epochs / 6.0 * 5 / 6)) << c;
}

// ---- ShardedSampler --------------------------------------------------------------------------

using data::ShardedSampler;

TEST(ShardedSampler, OneRankWalksThePermutation) {
  ShardedSampler s(100, 10, 5);
  EXPECT_EQ(s.steps_per_epoch(), 10);
  const auto perm = epoch_permutation(5, 3, 100);
  std::vector<uint32_t> all;
  for (int64_t step = 0; step < 10; ++step) {
    const auto idx = s.indices(3, step);
    ASSERT_EQ(idx.size(), 10u);
    EXPECT_TRUE(std::equal(idx.begin(), idx.end(), perm.begin() + step * 10));
    all.insert(all.end(), idx.begin(), idx.end());
  }
  EXPECT_TRUE(is_permutation_of_iota(all));
}

TEST(ShardedSampler, EpochsAreShuffledDifferently) {
  ShardedSampler s(100, 10, 5);
  const auto e0 = s.indices(0, 0);
  const auto e1 = s.indices(1, 0);
  EXPECT_NE(e0, e1);
  EXPECT_EQ(s.indices(0, 0), e0);  // going back to an earlier epoch gives its order again
  ShardedSampler other_seed(100, 10, 6);
  EXPECT_NE(other_seed.indices(0, 0), e0);
}

// Rank r of W takes the r-th contiguous part of each global batch; the parts, in rank order,
// are exactly the one-rank batch, whatever W, for full and short (kept) last batches.
TEST(ShardedSampler, RanksSplitEveryGlobalBatchContiguously) {
  for (bool drop_last : {true, false}) {
    for (int64_t count : {100, 105, 37}) {
      for (int64_t g : {10, 12}) {
        ShardedSampler one(count, g, 3, 0, 1, drop_last);
        for (int world : {2, 3, 4, 5}) {
          std::vector<ShardedSampler> ranks;
          for (int r = 0; r < world; ++r) ranks.emplace_back(count, g, 3, r, world, drop_last);
          for (int64_t epoch : {0, 1}) {
            for (int64_t step = 0; step < one.steps_per_epoch(); ++step) {
              const auto whole = one.indices(epoch, step);
              std::vector<uint32_t> joined;
              size_t smallest = whole.size(), largest = 0;
              for (auto& rs : ranks) {
                ASSERT_EQ(rs.steps_per_epoch(), one.steps_per_epoch());
                const auto part = rs.indices(epoch, step);
                smallest = std::min(smallest, part.size());
                largest = std::max(largest, part.size());
                joined.insert(joined.end(), part.begin(), part.end());
              }
              EXPECT_EQ(joined, whole) << "count " << count << " G " << g << " W " << world << " step " << step;
              EXPECT_LE(largest - smallest, 1u);  // balanced
            }
          }
        }
      }
    }
  }
}

TEST(ShardedSampler, DropLastAndKeepLastStepCounts) {
  ShardedSampler drop(105, 10, 1, 0, 1, true);
  ShardedSampler keep(105, 10, 1, 0, 1, false);
  EXPECT_EQ(drop.steps_per_epoch(), 10);
  EXPECT_EQ(keep.steps_per_epoch(), 11);
  EXPECT_EQ(keep.global_batch_length(9), 10);
  EXPECT_EQ(keep.global_batch_length(10), 5);
  const auto last = keep.indices(0, 10);
  EXPECT_EQ(last.size(), 5u);
  // Kept: the whole epoch, every sample once.
  std::vector<uint32_t> all;
  for (int64_t s = 0; s < keep.steps_per_epoch(); ++s) {
    const auto idx = keep.indices(2, s);
    all.insert(all.end(), idx.begin(), idx.end());
  }
  EXPECT_TRUE(is_permutation_of_iota(all));
  // An exact multiple has no short batch either way.
  EXPECT_EQ(ShardedSampler(100, 10, 1, 0, 1, false).steps_per_epoch(), 10);
  // Fewer samples than one batch: one short step when kept.
  ShardedSampler tiny(7, 10, 1, 0, 1, false);
  EXPECT_EQ(tiny.steps_per_epoch(), 1);
  EXPECT_EQ(tiny.indices(0, 0).size(), 7u);
}

TEST(ShardedSampler, ShortLastBatchIsSplitAcrossRanks) {
  // 105 samples, G = 10: the kept last batch has 5 samples; 4 ranks take 1, 1, 1, 2.
  const std::vector<size_t> want{1, 1, 1, 2};
  std::vector<uint32_t> joined;
  for (int r = 0; r < 4; ++r) {
    ShardedSampler s(105, 10, 1, r, 4, false);
    const auto part = s.indices(0, 10);
    EXPECT_EQ(part.size(), want[r]) << "rank " << r;
    joined.insert(joined.end(), part.begin(), part.end());
  }
  EXPECT_EQ(joined, ShardedSampler(105, 10, 1, 0, 1, false).indices(0, 10));
  // Uneven full batches: G = 10 on 3 ranks is 3, 3, 4.
  for (int r = 0; r < 3; ++r) EXPECT_EQ(ShardedSampler(100, 10, 1, r, 3).indices(0, 0).size(), r < 2 ? 3u : 4u);
}

TEST(ShardedSampler, RejectsImpossibleConfigurations) {
  auto kind = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return static_cast<int>(e.kind());
    }
    return -1;
  };
  // Fewer samples per global batch than ranks.
  EXPECT_EQ(kind([] { ShardedSampler(100, 3, 1, 0, 4); }), static_cast<int>(ErrorKind::Usage));
  // Not one full batch with drop_last.
  EXPECT_EQ(kind([] { ShardedSampler(5, 10, 1, 0, 1, true); }), static_cast<int>(ErrorKind::Usage));
  // More samples than an epoch's 32-bit permutation can order (packed shards can hold that many).
  EXPECT_EQ(kind([] { ShardedSampler((int64_t{1} << 32) + 16, 16, 1, 0, 1); }), static_cast<int>(ErrorKind::Usage));
  // Asking for a step past the end is a bug in the caller.
  EXPECT_EQ(kind([] { ShardedSampler(100, 10, 1).indices(0, 10); }), static_cast<int>(ErrorKind::Internal));
}

}  // namespace
// An epoch interrupted after k steps on 4 ranks and resumed on 2 (or 1) with the same global
// batch reads every sample of the epoch's batches exactly once, in the same order.
TEST(ShardedSampler, ResumeOnAnotherWorldSizeSkipsAndRepeatsNothing) {
  const int64_t count = 1000, global = 64;
  for (const auto& [before, after] : {std::pair{4, 2}, std::pair{2, 1}, std::pair{3, 4}}) {
    for (int64_t k : {0, 1, 7, 15}) {
      std::vector<uint32_t> seen;
      auto take = [&](int world, int64_t from, int64_t to) {
        for (int64_t step = from; step < to; ++step)
          for (int r = 0; r < world; ++r) {
            data::ShardedSampler s(count, global, 9, r, world);
            const auto idx = s.indices(2, step);
            seen.insert(seen.end(), idx.begin(), idx.end());
          }
      };
      data::ShardedSampler one(count, global, 9);
      take(before, 0, k);
      take(after, k, one.steps_per_epoch());
      std::vector<uint32_t> want;
      for (int64_t step = 0; step < one.steps_per_epoch(); ++step) {
        const auto idx = one.indices(2, step);
        want.insert(want.end(), idx.begin(), idx.end());
      }
      EXPECT_EQ(seen, want) << before << " -> " << after << " ranks after step " << k;
      EXPECT_EQ(std::set<uint32_t>(seen.begin(), seen.end()).size(), seen.size());
    }
  }
}

}  // namespace hpc

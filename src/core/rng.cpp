#include "core/rng.hpp"

#include <cmath>
#include <numeric>

namespace hpc {
namespace {
constexpr uint32_t kM0 = 0xD2511F53, kM1 = 0xCD9E8D57;
constexpr uint32_t kW0 = 0x9E3779B9, kW1 = 0xBB67AE85;

inline void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}
}  // namespace

Philox::Philox(uint64_t seed, RngStream stream, uint64_t a, uint64_t b)
    : key_{static_cast<uint32_t>(seed) ^ (static_cast<uint32_t>(stream) * 0x85EBCA6Bu),
           static_cast<uint32_t>(seed >> 32) ^ static_cast<uint32_t>(stream)},
      // ctr_[0] counts blocks within the stream; a and b name the stream's position.
      ctr_{0, static_cast<uint32_t>(a) ^ static_cast<uint32_t>(a >> 32) * 0x27D4EB2Du,
           static_cast<uint32_t>(b), static_cast<uint32_t>(b >> 32)} {}

void Philox::refill() {
  std::array<uint32_t, 4> c = ctr_;
  std::array<uint32_t, 2> k = key_;
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kM0, c[0], hi0, lo0);
    mulhilo(kM1, c[2], hi1, lo1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
    k[0] += kW0;
    k[1] += kW1;
  }
  out_ = c;
  used_ = 0;
  ++ctr_[0];
}

uint32_t Philox::next_u32() {
  if (used_ == 4) refill();
  return out_[used_++];
}

float Philox::uniform() { return static_cast<float>(next_u32() >> 8) * (1.0f / 16777216.0f); }

double Philox::uniform_double() {
  uint64_t hi = next_u32() >> 5, lo = next_u32() >> 6;  // 27 + 26 = 53 bits
  return static_cast<double>((hi << 26) | lo) * (1.0 / 9007199254740992.0);
}

double Philox::normal() {
  double u1 = uniform_double(), u2 = uniform_double();
  if (u1 < 1e-300) u1 = 1e-300;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

uint32_t Philox::below(uint32_t n) {
  uint64_t m = static_cast<uint64_t>(next_u32()) * n;
  uint32_t low = static_cast<uint32_t>(m);
  if (low < n) {
    uint32_t threshold = static_cast<uint32_t>(-n) % n;
    while (low < threshold) {
      m = static_cast<uint64_t>(next_u32()) * n;
      low = static_cast<uint32_t>(m);
    }
  }
  return static_cast<uint32_t>(m >> 32);
}

std::vector<uint32_t> epoch_permutation(uint64_t seed, uint64_t epoch, uint32_t n) {
  std::vector<uint32_t> perm(n);
  std::iota(perm.begin(), perm.end(), 0u);
  Philox rng(seed, RngStream::Shuffle, epoch);
  for (uint32_t i = n; i > 1; --i) std::swap(perm[i - 1], perm[rng.below(i)]);
  return perm;
}

}  // namespace hpc

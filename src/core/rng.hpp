// Counter-based randomness (Philox4x32-10, Salmon et al. 2011). A value is a pure function of
// (key, counter), so augmentation of sample i in epoch e is the same whichever rank or thread
// computes it, and nothing has to be carried between steps to resume exactly (principle 5).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace hpc {

// Stream identifiers keep the uses of one seed apart.
enum class RngStream : uint32_t { Init = 1, Shuffle = 2, Augment = 3, Dropout = 4, Test = 5, Pack = 6, Synthetic = 7 };

class Philox {
 public:
  // key = (seed, stream); the counter's high words are (a, b): e.g. (epoch, sample index).
  Philox(uint64_t seed, RngStream stream, uint64_t a = 0, uint64_t b = 0);
  uint32_t next_u32();
  // Uniform in [0, 1) with 24 random bits (exactly representable in float).
  float uniform();
  // Uniform in [0, 1) with 53 random bits.
  double uniform_double();
  // Standard normal (Box-Muller on two doubles).
  double normal();
  // Uniform integer in [0, n) without modulo bias (Lemire's method).
  uint32_t below(uint32_t n);

 private:
  void refill();
  std::array<uint32_t, 2> key_;
  std::array<uint32_t, 4> ctr_;
  std::array<uint32_t, 4> out_{};
  int used_ = 4;
};

// A permutation of [0, n) drawn from (seed, epoch): Fisher-Yates on a Philox stream.
std::vector<uint32_t> epoch_permutation(uint64_t seed, uint64_t epoch, uint32_t n);

}  // namespace hpc

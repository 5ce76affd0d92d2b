#include "data/sampler.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "core/rng.hpp"

namespace hpc::data {

ShardedSampler::ShardedSampler(int64_t count, int64_t global_batch, uint64_t seed, int rank, int world,
                               bool drop_last)
    : count_(count), global_batch_(global_batch), seed_(seed), rank_(rank), world_(world), drop_last_(drop_last) {
  HPC_REQUIRE(global_batch >= world, "the global batch (", global_batch, ") must hold at least one sample per rank (",
              world, " ranks)");
  HPC_REQUIRE(count >= global_batch || !drop_last, "the dataset holds ", count,
              " training samples, fewer than one global batch of ", global_batch);
  HPC_CHECK(rank >= 0 && rank < world, "rank ", rank, " of ", world);
  // An epoch's order is a permutation of 32-bit indices (core/rng.hpp): a larger split would be
  // shuffled in part and read past its end.
  HPC_REQUIRE(count <= int64_t{UINT32_MAX}, "the dataset holds ", count, " training samples, more than the ",
              UINT32_MAX, " one epoch can shuffle");
}

int64_t ShardedSampler::steps_per_epoch() const {
  return drop_last_ ? count_ / global_batch_ : (count_ + global_batch_ - 1) / global_batch_;
}

int64_t ShardedSampler::global_batch_length(int64_t step) const {
  return std::min(global_batch_, count_ - step * global_batch_);
}

const std::vector<uint32_t>& ShardedSampler::permutation(int64_t epoch) {
  if (epoch != perm_epoch_) {
    perm_ = epoch_permutation(seed_, static_cast<uint64_t>(epoch), static_cast<uint32_t>(count_));
    perm_epoch_ = epoch;
  }
  return perm_;
}

std::vector<uint32_t> ShardedSampler::indices(int64_t epoch, int64_t step) {
  HPC_CHECK(step >= 0 && step < steps_per_epoch(), "step ", step, " of ", steps_per_epoch());
  const auto& perm = permutation(epoch);
  const int64_t len = global_batch_length(step), start = step * global_batch_;
  const int64_t lo = start + rank_ * len / world_, hi = start + (rank_ + 1) * len / world_;
  return {perm.begin() + lo, perm.begin() + hi};
}

}  // namespace hpc::data

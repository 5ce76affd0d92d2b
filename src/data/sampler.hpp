// ShardedSampler: which samples each rank reads at each step.
//
// The epoch's order is a permutation drawn from (seed, epoch). Global step s of an epoch
// covers positions [s*G, (s+1)*G) of it, G the global batch; rank r of W takes the
// contiguous part [s*G + r*len/W, s*G + (r+1)*len/W) with len the batch's length. With
// drop_last (the default, as the PyTorch peer) the short tail of the epoch is skipped; without
// it the last global batch has len = count - s*G and is split the same way on every world
// size, so the set of samples seen per epoch does not depend on W.
#pragma once

#include <cstdint>
#include <vector>

namespace hpc::data {

class ShardedSampler {
 public:
  ShardedSampler(int64_t count, int64_t global_batch, uint64_t seed, int rank = 0, int world = 1,
                 bool drop_last = true);
  int64_t steps_per_epoch() const;
  // Length of global step `step`'s batch (G, or less for a kept tail).
  int64_t global_batch_length(int64_t step) const;
  // This rank's sample indices for (epoch, step).
  std::vector<uint32_t> indices(int64_t epoch, int64_t step);
  int64_t global_batch() const { return global_batch_; }

 private:
  const std::vector<uint32_t>& permutation(int64_t epoch);
  int64_t count_, global_batch_;
  uint64_t seed_;
  int rank_, world_;
  bool drop_last_;
  int64_t perm_epoch_ = -1;
  std::vector<uint32_t> perm_;
};

}  // namespace hpc::data

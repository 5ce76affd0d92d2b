// The images of a packed split (shards.hpp), decoded when a batch asks for them: hpctrain's
// Dataset for image folders packed by `hpcdata pack`. Only the shards' indexes are read up front;
// each sample costs one pread of its record and one JPEG decode, so a rank reads only the
// records its sampler gives it, and loader threads decode in parallel.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/rng.hpp"
#include "data/shards.hpp"

namespace hpc::data {

struct Image;

// The share of the shorter side that evaluation's centre crop keeps (ImageNet's 224 of 256).
constexpr double kEvaluationCrop = 7.0 / 8.0;

// The centre crop of `fraction` of the image's shorter side, bilinear-resampled to size x size
// RGB bytes into out: evaluation's view of a packed image (fraction kEvaluationCrop), which
// `hpctrain predict` gives the user's images too.
void centre_view(const Image& image, double fraction, int64_t size, uint8_t* out);

class ShardImages {
 public:
  // size: the side of the square images the model is given.
  ShardImages(std::vector<ShardReader> shards, int64_t size);
  int64_t count() const { return first_.empty() ? 0 : first_.back(); }
  int64_t size() const { return size_; }
  std::vector<int32_t> labels() const;
  // Sample i as size x size x 3 bytes (RGB, row-major) into out. With rng (training): a random
  // resized crop (area 8%..100% of the image, aspect ratio 3/4..4/3, as torchvision's
  // RandomResizedCrop) flipped horizontally with probability 1/2 when flip is set. Without: the
  // centre crop of 7/8 of the shorter side (the 224-of-256 of ImageNet evaluation).
  void fill(int64_t i, Philox* rng, bool flip, uint8_t* out) const;

 private:
  std::vector<ShardReader> shards_;
  std::vector<int64_t> first_;  // first_[s]: global index of shard s's first record; back(): the count
  int64_t size_;
};

}  // namespace hpc::data

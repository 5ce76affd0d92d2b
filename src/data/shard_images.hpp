// The images of a packed split (shards.hpp), decoded when a batch asks for them: hpctrain's
// Dataset for image folders packed by `hpcdata pack`. Only the shards' indexes are read up front;
// each sample costs one pread of its record and one JPEG decode, so a rank reads only the
// records its sampler gives it, and loader threads decode in parallel.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
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

// The part of an image the model is given, in source pixels (rows y0 .. y0 + h, columns
// x0 .. x0 + w), mirrored left to right when flip: what the CPU resamples (resample below) and
// what the GPU decoder's kernel resamples (kernels::resized_crop_normalize), the same geometry.
struct View {
  double y0 = 0, x0 = 0, h = 0, w = 0;
  bool flip = false;
};

// Training's view of a height x width image, drawn from rng: a random resized crop (area 8%..100%
// of the image, aspect ratio 3/4..4/3, as torchvision's RandomResizedCrop), flipped with
// probability 1/2 when flip is set. Without rng (evaluation): the centre crop of 7/8 of the
// shorter side (the 224-of-256 of ImageNet evaluation).
View draw_view(int64_t height, int64_t width, Philox* rng, bool flip);
// The view bilinear-resampled (pixel centres aligned) to size x size RGB bytes into out.
void resample(const Image& image, const View& view, int64_t size, uint8_t* out);

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
  // Sample i left undecoded: its JPEG file into bytes, the image's dimensions from its header and
  // the view fill() would resample (the same draws from rng).
  void jpeg(int64_t i, Philox* rng, bool flip, std::vector<uint8_t>& bytes, int64_t& height, int64_t& width,
            View& view) const;

 private:
  // The shard of sample i and its record there.
  std::pair<size_t, int64_t> locate(int64_t i) const;
  std::vector<ShardReader> shards_;
  std::vector<int64_t> first_;  // first_[s]: global index of shard s's first record; back(): the count
  int64_t size_;
};

}  // namespace hpc::data

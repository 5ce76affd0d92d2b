#include "data/shard_images.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "data/jpeg.hpp"

namespace hpc::data {
namespace {

// torchvision's RandomResizedCrop(scale=(0.08, 1), ratio=(3/4, 4/3)): ten tries at a random
// area and aspect ratio, then the largest centred crop within the ratio range.
View random_resized_crop(int64_t height, int64_t width, Philox& rng) {
  const double area = static_cast<double>(height * width);
  const double log_lo = std::log(3.0 / 4.0), log_hi = std::log(4.0 / 3.0);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * (0.08 + 0.92 * rng.uniform_double());
    const double ratio = std::exp(log_lo + (log_hi - log_lo) * rng.uniform_double());
    const auto w = static_cast<int64_t>(std::lround(std::sqrt(target * ratio)));
    const auto h = static_cast<int64_t>(std::lround(std::sqrt(target / ratio)));
    if (w > 0 && h > 0 && w <= width && h <= height) {
      const auto y0 = static_cast<int64_t>(rng.below(static_cast<uint32_t>(height - h + 1)));
      const auto x0 = static_cast<int64_t>(rng.below(static_cast<uint32_t>(width - w + 1)));
      return {static_cast<double>(y0), static_cast<double>(x0), static_cast<double>(h), static_cast<double>(w), false};
    }
  }
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  double w = static_cast<double>(width), h = static_cast<double>(height);
  if (in_ratio < 3.0 / 4.0) h = std::round(w / (3.0 / 4.0));
  else if (in_ratio > 4.0 / 3.0) w = std::round(h * 4.0 / 3.0);
  return {(static_cast<double>(height) - h) / 2, (static_cast<double>(width) - w) / 2, h, w, false};
}

View centre_crop(int64_t height, int64_t width, double fraction = kEvaluationCrop) {
  const double side = static_cast<double>(std::min(height, width)) * fraction;
  return {(static_cast<double>(height) - side) / 2, (static_cast<double>(width) - side) / 2, side, side, false};
}

}  // namespace

View draw_view(int64_t height, int64_t width, Philox* rng, bool flip) {
  if (!rng) return centre_crop(height, width);
  View v = random_resized_crop(height, width, *rng);
  v.flip = flip && (rng->next_u32() & 1u);  // drawn after the crop, as it always was
  return v;
}

void resample(const Image& img, const View& r, int64_t size, uint8_t* out) {
  const bool flip = r.flip;
  const double sy = r.h / static_cast<double>(size), sx = r.w / static_cast<double>(size);
  for (int64_t oy = 0; oy < size; ++oy) {
    const double fy = std::clamp(r.y0 + (static_cast<double>(oy) + 0.5) * sy - 0.5, 0.0, static_cast<double>(img.height - 1));
    const auto y0 = static_cast<int64_t>(fy);
    const int64_t y1 = std::min(y0 + 1, img.height - 1);
    const double wy = fy - static_cast<double>(y0);
    for (int64_t ox = 0; ox < size; ++ox) {
      const int64_t src_x = flip ? size - 1 - ox : ox;
      const double fx = std::clamp(r.x0 + (static_cast<double>(src_x) + 0.5) * sx - 0.5, 0.0, static_cast<double>(img.width - 1));
      const auto x0 = static_cast<int64_t>(fx);
      const int64_t x1 = std::min(x0 + 1, img.width - 1);
      const double wx = fx - static_cast<double>(x0);
      const uint8_t* p00 = &img.pixels[static_cast<size_t>((y0 * img.width + x0) * 3)];
      const uint8_t* p01 = &img.pixels[static_cast<size_t>((y0 * img.width + x1) * 3)];
      const uint8_t* p10 = &img.pixels[static_cast<size_t>((y1 * img.width + x0) * 3)];
      const uint8_t* p11 = &img.pixels[static_cast<size_t>((y1 * img.width + x1) * 3)];
      uint8_t* q = out + (oy * size + ox) * 3;
      for (int c = 0; c < 3; ++c) {
        const double v = (1 - wy) * ((1 - wx) * p00[c] + wx * p01[c]) + wy * ((1 - wx) * p10[c] + wx * p11[c]);
        q[c] = static_cast<uint8_t>(std::clamp(v + 0.5, 0.0, 255.0));
      }
    }
  }
}

void centre_view(const Image& image, double fraction, int64_t size, uint8_t* out) {
  HPC_CHECK(fraction > 0 && fraction <= 1 && size > 0, "centre_view(", fraction, ", ", size, ")");
  resample(image, centre_crop(image.height, image.width, fraction), size, out);
}

ShardImages::ShardImages(std::vector<ShardReader> shards, int64_t size) : shards_(std::move(shards)), size_(size) {
  HPC_REQUIRE(size > 0, "the image size must be positive");
  first_.push_back(0);
  for (const ShardReader& s : shards_) first_.push_back(first_.back() + s.count());
}

std::vector<int32_t> ShardImages::labels() const {
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(count()));
  for (const ShardReader& s : shards_)
    for (int64_t i = 0; i < s.count(); ++i) out.push_back(static_cast<int32_t>(s.record(i).label));
  return out;
}

std::pair<size_t, int64_t> ShardImages::locate(int64_t i) const {
  HPC_CHECK(i >= 0 && i < count(), "sample ", i, " of ", count());
  const auto s = static_cast<size_t>(std::upper_bound(first_.begin(), first_.end(), i) - first_.begin() - 1);
  return {s, i - first_[s]};
}

void ShardImages::fill(int64_t i, Philox* rng, bool flip, uint8_t* out) const {
  const auto [s, r] = locate(i);
  thread_local std::vector<uint8_t> bytes;
  shards_[s].read(r, bytes);
  const Image img = decode_jpeg(bytes, shards_[s].path() + " record " + std::to_string(r));
  resample(img, draw_view(img.height, img.width, rng, flip), size_, out);
}

void ShardImages::jpeg(int64_t i, Philox* rng, bool flip, std::vector<uint8_t>& bytes, int64_t& height,
                       int64_t& width, View& view) const {
  const auto [s, r] = locate(i);
  shards_[s].read(r, bytes);
  jpeg_size(bytes, shards_[s].path() + " record " + std::to_string(r), height, width);
  view = draw_view(height, width, rng, flip);
}

}  // namespace hpc::data

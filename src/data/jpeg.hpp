// JPEG decoding and encoding through libjpeg-turbo (its TurboJPEG API), for packed image shards:
// images are always decoded to interleaved RGB (grey and CMYK files too), and any warning the
// decoder raises (a truncated or damaged file) is an error, never a half-grey image.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace hpc::data {

// Leaves the bytes a vector grows by uninitialised: a decoder writes every pixel, so a damaged
// file whose header claims 16000x16000 costs neither the 768 MB nor the seconds of zeroing them
// before its error (what the decoder writes is all a vector of them ever touches).
template <class T>
struct UninitialisedAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = UninitialisedAllocator<U>;
  };
  UninitialisedAllocator() = default;
  template <class U>
  UninitialisedAllocator(const UninitialisedAllocator<U>&) noexcept {}
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
using PixelBytes = std::vector<uint8_t, UninitialisedAllocator<uint8_t>>;

struct Image {
  int64_t height = 0, width = 0;  // always 3 channels, RGB, row-major
  PixelBytes pixels;              // height x width x 3; resize() leaves new bytes unset
};

// Decodes a JPEG; `what` names it in the error (a file, or a shard and record). Anything the
// decoder cannot read cleanly is a usage error naming it (as with every bad dataset file).
// A CMYK (or YCCK) file, as Photoshop writes them (ImageNet has a few), is converted as OpenCV
// and Pillow do: its components stored inverted, R = C x K / 255; `cmyk` says it was one.
Image decode_jpeg(std::span<const uint8_t> bytes, const std::string& what, bool* cmyk = nullptr);
// Only the dimensions, from the header.
void jpeg_size(std::span<const uint8_t> bytes, const std::string& what, int64_t& height, int64_t& width);
// Encodes RGB pixels (4:2:0 chroma, as most photographs are stored).
std::vector<uint8_t> encode_jpeg(const Image& image, int quality);
// Scales so that the shorter side becomes `side` (never up), by averaging the source pixels each
// destination pixel covers (area resampling, what shrinking photographs wants).
Image resize_shorter_side(const Image& image, int64_t side);

}  // namespace hpc::data

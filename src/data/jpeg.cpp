#include "data/jpeg.hpp"

#include <turbojpeg.h>

#include <algorithm>
#include <memory>

#include "core/error.hpp"

namespace hpc::data {
namespace {

struct TjDeleter {
  void operator()(void* h) const { tjDestroy(h); }
};
using TjHandle = std::unique_ptr<void, TjDeleter>;

// One decompressor and one compressor per thread (loader and packer threads decode in parallel).
// A decompressor that failed on a damaged image is not trusted with the next one (libjpeg-turbo
// 2.1 can carry the failure over): fresh_decompressor() replaces it.
TjHandle& decompressor_slot() {
  thread_local TjHandle h;
  if (!h) h.reset(tjInitDecompress());
  HPC_CHECK(h, "libjpeg-turbo: cannot create a decompressor: ", tjGetErrorStr2(nullptr));
  return h;
}
tjhandle decompressor() { return decompressor_slot().get(); }
void fail_decompressor() { decompressor_slot().reset(); }

tjhandle compressor() {
  thread_local TjHandle h(tjInitCompress());
  HPC_CHECK(h, "libjpeg-turbo: cannot create a compressor: ", tjGetErrorStr2(nullptr));
  return h.get();
}

// The dimensions and colour space (TJCS_*) of a JPEG.
void read_header(tjhandle h, std::span<const uint8_t> bytes, const std::string& what, int& width, int& height,
                 int& colorspace) {
  int subsamp = 0;
  HPC_REQUIRE(!bytes.empty(), what, " is empty, not a JPEG image");
  if (tjDecompressHeader3(h, bytes.data(), static_cast<unsigned long>(bytes.size()), &width, &height, &subsamp,
                          &colorspace) != 0) {
    const std::string why = tjGetErrorStr2(h);
    fail_decompressor();
    usage_error(what, " is not a readable JPEG image: ", why);
  }
  HPC_REQUIRE(width > 0 && height > 0 && static_cast<int64_t>(width) * height <= (int64_t{1} << 28), what,
              " has implausible dimensions ", width, "x", height);
}

}  // namespace

void jpeg_size(std::span<const uint8_t> bytes, const std::string& what, int64_t& height, int64_t& width) {
  int w = 0, h = 0, colorspace = 0;
  read_header(decompressor(), bytes, what, w, h, colorspace);
  height = h;
  width = w;
}

Image decode_jpeg(std::span<const uint8_t> bytes, const std::string& what, bool* cmyk) {
  tjhandle h = decompressor();
  int w = 0, ht = 0, colorspace = 0;
  read_header(h, bytes, what, w, ht, colorspace);
  // libjpeg-turbo decodes CMYK and YCCK files to CMYK only: converted to RGB below.
  const bool four = colorspace == TJCS_CMYK || colorspace == TJCS_YCCK;
  if (cmyk) *cmyk = four;
  Image img;
  img.height = ht;
  img.width = w;
  const size_t pixels = static_cast<size_t>(w) * ht;
  img.pixels.resize(pixels * (four ? 4 : 3));
  // STOPONWARNING: a truncated or damaged file is an error, not an image padded with grey.
  // LIMITSCANS: a progressive file of more than 500 scans (each a pass over the whole image, the
  // known way to make a small file take minutes) is refused.
  const int rc = tjDecompress2(h, bytes.data(), static_cast<unsigned long>(bytes.size()), img.pixels.data(), w, 0, ht,
                               four ? TJPF_CMYK : TJPF_RGB,
                               TJFLAG_ACCURATEDCT | TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS);
  if (rc != 0) {
    const std::string why = tjGetErrorStr2(h);
    fail_decompressor();
    usage_error(what, " is a damaged JPEG image: ", why);
  }
  if (four) {
    uint8_t* p = img.pixels.data();
    for (size_t i = 0; i < pixels; ++i)
      for (int c = 0; c < 3; ++c) p[3 * i + c] = static_cast<uint8_t>((p[4 * i + c] * p[4 * i + 3] + 127) / 255);
    img.pixels.resize(pixels * 3);
  }
  return img;
}

std::vector<uint8_t> encode_jpeg(const Image& image, int quality) {
  HPC_CHECK(image.height > 0 && image.width > 0 && image.pixels.size() == static_cast<size_t>(image.height * image.width * 3),
            "encode_jpeg: bad image");
  tjhandle h = compressor();
  unsigned char* out = nullptr;
  unsigned long size = 0;
  const int rc = tjCompress2(h, image.pixels.data(), static_cast<int>(image.width), 0, static_cast<int>(image.height),
                             TJPF_RGB, &out, &size, TJSAMP_420, quality, TJFLAG_ACCURATEDCT);
  std::unique_ptr<unsigned char, void (*)(unsigned char*)> owned(out, tjFree);
  HPC_CHECK(rc == 0, "libjpeg-turbo cannot encode a ", image.width, "x", image.height, " image: ", tjGetErrorStr2(h));
  return {out, out + size};
}

Image resize_shorter_side(const Image& src, int64_t side) {
  const int64_t shorter = std::min(src.height, src.width);
  if (side <= 0 || shorter <= side) return src;
  Image dst;
  dst.height = std::max<int64_t>(1, (src.height * side + shorter / 2) / shorter);
  dst.width = std::max<int64_t>(1, (src.width * side + shorter / 2) / shorter);
  if (src.height <= src.width) dst.height = side;
  if (src.width <= src.height) dst.width = side;
  dst.pixels.resize(static_cast<size_t>(dst.height * dst.width * 3));
  // Area resampling: destination pixel (y, x) covers source rows [y*H/h, (y+1)*H/h) and the
  // like for columns, weighted by how much of each source pixel lies inside.
  const double sy = static_cast<double>(src.height) / dst.height, sx = static_cast<double>(src.width) / dst.width;
  for (int64_t y = 0; y < dst.height; ++y) {
    const double y0 = y * sy, y1 = (y + 1) * sy;
    for (int64_t x = 0; x < dst.width; ++x) {
      const double x0 = x * sx, x1 = (x + 1) * sx;
      double acc[3] = {0, 0, 0}, total = 0;
      for (auto yy = static_cast<int64_t>(y0); yy < std::min<int64_t>(src.height, static_cast<int64_t>(y1 + 1)); ++yy) {
        const double wy = std::min<double>(yy + 1, y1) - std::max<double>(yy, y0);
        if (wy <= 0) continue;
        for (auto xx = static_cast<int64_t>(x0); xx < std::min<int64_t>(src.width, static_cast<int64_t>(x1 + 1)); ++xx) {
          const double wx = std::min<double>(xx + 1, x1) - std::max<double>(xx, x0);
          if (wx <= 0) continue;
          const uint8_t* p = &src.pixels[static_cast<size_t>((yy * src.width + xx) * 3)];
          for (int c = 0; c < 3; ++c) acc[c] += wy * wx * p[c];
          total += wy * wx;
        }
      }
      uint8_t* q = &dst.pixels[static_cast<size_t>((y * dst.width + x) * 3)];
      for (int c = 0; c < 3; ++c) q[c] = static_cast<uint8_t>(std::clamp(acc[c] / total + 0.5, 0.0, 255.0));
    }
  }
  return dst;
}

}  // namespace hpc::data

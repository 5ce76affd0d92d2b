#include "data/image_file.hpp"

#include <fcntl.h>
#include <png.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "core/error.hpp"
#include "core/file_identity.hpp"
#include "data/shard_images.hpp"

namespace hpc::data {
namespace {

constexpr uint8_t kPngMagic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
constexpr uint8_t kJpegMagic[3] = {0xff, 0xd8, 0xff};

bool starts_with(std::span<const uint8_t> bytes, const uint8_t* magic, size_t n) {
  return bytes.size() >= n && std::memcmp(bytes.data(), magic, n) == 0;
}

// png_image's resources, freed however the read ends.
struct PngImage {
  png_image image{};
  PngImage() { image.version = PNG_IMAGE_VERSION; }
  ~PngImage() { png_image_free(&image); }
  PngImage(const PngImage&) = delete;
  PngImage& operator=(const PngImage&) = delete;
};


// The centre square of the image (its shorter side), copied.
Image centre_square(const Image& image) {
  const int64_t side = std::min(image.height, image.width);
  if (side == image.height && side == image.width) return image;
  Image sq;
  sq.height = sq.width = side;
  sq.pixels.resize(static_cast<size_t>(side * side * 3));
  const int64_t y0 = (image.height - side) / 2, x0 = (image.width - side) / 2;
  for (int64_t y = 0; y < side; ++y)
    std::memcpy(&sq.pixels[static_cast<size_t>(y * side * 3)],
                &image.pixels[static_cast<size_t>(((y0 + y) * image.width + x0) * 3)], static_cast<size_t>(side * 3));
  return sq;
}

void to_channels(const uint8_t* rgb, int64_t pixels, int64_t channels, uint8_t* out) {
  if (channels == 3) {
    std::memcpy(out, rgb, static_cast<size_t>(pixels * 3));
    return;
  }
  HPC_CHECK(channels == 1, "a model of ", channels, " channels");
  // BT.601 luma in 16-bit fixed point; the weights sum to 65536, so grey stays itself.
  for (int64_t i = 0; i < pixels; ++i, rgb += 3)
    out[i] = static_cast<uint8_t>((19595u * rgb[0] + 38470u * rgb[1] + 7471u * rgb[2] + 32768u) >> 16);
}

}  // namespace

std::vector<uint8_t> read_whole_file(const std::string& path) {
  return read_data_file(path, "image", kMaxImageFileBytes);
}

bool looks_like_image(std::span<const uint8_t> bytes) {
  return starts_with(bytes, kPngMagic, sizeof kPngMagic) || starts_with(bytes, kJpegMagic, sizeof kJpegMagic);
}

Image decode_png(std::span<const uint8_t> bytes, const std::string& what) {
  PngImage png;
  if (!png_image_begin_read_from_memory(&png.image, bytes.data(), bytes.size()))
    usage_error(what, " is not a readable PNG image: ", png.image.message);
  const int64_t w = png.image.width, h = png.image.height;
  HPC_REQUIRE(w > 0 && h > 0 && w * h <= (int64_t{1} << 28), what, " has implausible dimensions ", w, "x", h);
  // Its pixels take a bit each at the least (1-bit grey), and deflate makes at most 1032 bytes of
  // each byte it reads: a file that claims more pixels than its bytes can hold is cut or damaged,
  // refused before its pixels are allocated (a 1 kB file claiming 16384x16384 took 805 MB, zeroed,
  // in each thread that decoded it, before libpng found the data missing).
  HPC_REQUIRE(w * h / 8 <= 1032 * static_cast<int64_t>(bytes.size()), what, " is a damaged PNG image: its ", w, "x",
              h, " pixels cannot come from ", bytes.size(), " bytes");
  png.image.format = PNG_FORMAT_RGB;
  // 16-bit samples are sRGB like 8-bit ones, scaled down as OpenCV and PIL do; without the flag
  // libpng took them for linear light, and a grey of 128 read as 186.
  png.image.flags |= PNG_IMAGE_FLAG_16BIT_sRGB;
  Image img;
  img.height = h;
  img.width = w;
  img.pixels.assign(static_cast<size_t>(w * h * 3), 0);  // what alpha is composited on: black
  if (!png_image_finish_read(&png.image, nullptr, img.pixels.data(), 0, nullptr))
    usage_error(what, " is a damaged PNG image: ", png.image.message);
  return img;
}

Image read_image_file(const std::string& path) {
  const std::vector<uint8_t> bytes = read_whole_file(path);
  HPC_REQUIRE(!bytes.empty(), "image ", path, " is empty");
  if (starts_with(bytes, kPngMagic, sizeof kPngMagic)) return decode_png(bytes, "image " + path);
  if (starts_with(bytes, kJpegMagic, sizeof kJpegMagic)) return decode_jpeg(bytes, "image " + path);
  usage_error(path, " is not a PNG or JPEG image");
}

void frame_for_model(const Image& image, const DatasetFacts& facts, uint8_t* out) {
  HPC_CHECK(facts.height == facts.width && facts.height > 0, "a model input of ", facts.height, "x", facts.width);
  const int64_t side = facts.height, pixels = side * side;
  std::vector<uint8_t> rgb(static_cast<size_t>(pixels * 3));
  const Image square = facts.crop_fraction < 1 ? Image{} : centre_square(image);
  if (facts.crop_fraction < 1 || square.height < side) {
    centre_view(image, facts.crop_fraction, side, rgb.data());  // evaluation's crop; or enlarging
  } else {
    const Image sized = resize_shorter_side(square, side);  // area averaging; itself when of that size
    std::memcpy(rgb.data(), sized.pixels.data(), rgb.size());
  }
  to_channels(rgb.data(), pixels, facts.channels, out);
}

}  // namespace hpc::data

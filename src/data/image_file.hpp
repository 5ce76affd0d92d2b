// Image files a user hands to `hpctrain predict`: PNG through libpng's simplified API, JPEG
// through libjpeg-turbo (jpeg.hpp), recognised by their first bytes whatever their names say,
// and framed the way evaluation frames the model's test images.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "data/facts.hpp"
#include "data/jpeg.hpp"

namespace hpc::data {

// Files larger than this are refused before they are read (no image a model of this size
// classifies is one).
constexpr int64_t kMaxImageFileBytes = int64_t{1} << 28;

// The bytes of an image file: a regular file (a FIFO would block the read, a dangling link has
// none) of at most kMaxImageFileBytes; one usage error naming it and the reason otherwise.
std::vector<uint8_t> read_whole_file(const std::string& path);

// Whether bytes begin as a PNG or a JPEG file does.
bool looks_like_image(std::span<const uint8_t> bytes);

// A PNG, as interleaved RGB (grey, palette, 16-bit and alpha images converted by libpng; alpha
// composited on black). Usage error naming `what` when it is not a PNG or is damaged.
Image decode_png(std::span<const uint8_t> bytes, const std::string& what);

// A PNG or JPEG file's pixels, RGB. Anything else (not an image, truncated, damaged, not a
// regular file, unreadable) is one usage error naming the file and the reason.
Image read_image_file(const std::string& path);

// The image as the model takes it: facts.height x facts.width x facts.channels bytes into out.
// Packed shards' models see what evaluation gives them (the centre crop of 7/8 of the shorter
// side, bilinear-resampled: centre_view); the fixed-size datasets' models the centre square,
// shrunk by area averaging or enlarged bilinearly to their size, untouched when it has that
// size already. One channel: the luma of BT.601 (exactly v for a grey pixel v, v, v).
void frame_for_model(const Image& image, const DatasetFacts& facts, uint8_t* out);

}  // namespace hpc::data

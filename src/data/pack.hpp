// Packing an image folder (ImageNet layout: SRC/<class>/<image>.jpg) into shards (shards.hpp):
// what `hpcdata pack` runs. Classes are the sub-folders in name order (label = position, as
// torchvision's ImageFolder numbers them); the images are shuffled once with a fixed seed so
// that every shard mixes classes, then shards are written in parallel, one thread per shard.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace hpc::data {

struct PackOptions {
  std::string src, out;
  std::string split = "train";
  int64_t images_per_shard = 1024;
  int64_t resize = 0;     // shorter side scaled down to this many pixels (0: images kept as they are)
  int quality = 90;       // JPEG quality of resized images, and of CMYK ones converted to RGB
  int threads = 1;
  bool skip_corrupt = false;  // skip images that do not decode (and list them) instead of failing
  uint64_t seed = 0;
  // Called now and then from the calling thread with (images done, images in all).
  std::function<void(int64_t, int64_t)> progress;
  // Set (by a signal handler) to give up before the new shards are committed.
  const std::atomic<bool>* stop = nullptr;
};

struct PackResult {
  std::vector<std::string> classes;
  int64_t images = 0, shards = 0, bytes = 0, ignored_files = 0;
  int64_t cmyk_converted = 0;  // CMYK (or YCCK) JPEGs packed as RGB ones
  std::vector<std::string> skipped;  // images that did not decode (skip_corrupt)
  // Problems after the commit that leave the new split whole (a replaced shard not removed).
  std::vector<std::string> warnings;
};

// The usage errors, before anything is read or written: a split hpctrain does not read, SRC
// missing or not a directory, OUT a file, the root directory, the image folder or inside it.
void check_pack_paths(const PackOptions& options);

// Packs the checkpoint way: the new shards are written beside the split's current ones under
// new names, read back and verified, and only then does the split's manifest (OUT/<split>.json,
// the commit point, shards.hpp) change, in one rename; the replaced shards are removed after.
// Any error before the commit (an empty class folder, an undecodable image without
// skip_corrupt, a full disk, `stop`) is a usage error naming the cause, and leaves OUT exactly
// as it was: no new shard, manifest, classes.txt or directory stays.
PackResult pack_image_folder(const PackOptions& options);

}  // namespace hpc::data

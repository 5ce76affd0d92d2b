// CIFAR binary versions. CIFAR-10: each file is a sequence of 3073-byte records, one label byte
// (0..9) then 1024 red, 1024 green and 1024 blue bytes of a 32x32 image, row-major. CIFAR-100:
// 3074-byte records, a coarse label (0..19) and a fine label (0..99) byte, then the same pixels;
// hpctrain trains on the fine labels.
#include <filesystem>

#include "core/error.hpp"
#include "data/dataset.hpp"

namespace hpc::data {
namespace {

struct CifarFormat {
  const char* name;
  int64_t label_bytes;  // label bytes before the pixels
  int64_t label_at;     // which of them is the class
  int classes;
};

// Records of one file against the count its published version holds (0: any).
void check_record_count(const std::string& path, int64_t have, int64_t want, const CifarFormat& f) {
  if (want == 0 || have == want) return;
  const std::string name = std::filesystem::path(path).filename().string();
  HPC_REQUIRE(have < want, "dataset file ", path, " holds ", have, " ", f.name, " records, but the published ", name,
              " holds ", want, ": ", have - want, " too many (records appended from another file?)");
  usage_error("dataset file ", path, " holds ", have, " ", f.name, " records, but the published ", name, " holds ",
              want, ": ", want - have, " missing (truncated?)");
}

Dataset read_cifar(const std::vector<std::string>& paths, const CifarFormat& f, int64_t records_per_file) {
  constexpr int64_t kSide = 32, kPlane = kSide * kSide;
  const int64_t record = f.label_bytes + 3 * kPlane;
  Dataset d;
  d.height = d.width = kSide;
  d.channels = 3;
  d.classes = f.classes;
  // Every file holds its published count (checked below): room for all of them at once, so each
  // file's records are not copied again as the next one's are appended (300 MB moved for CIFAR-10).
  if (records_per_file > 0) {
    d.images.reserve(static_cast<size_t>(paths.size() * records_per_file * 3 * kPlane));
    d.labels.reserve(static_cast<size_t>(paths.size() * records_per_file));
  }
  for (const std::string& path : paths) {
    // Gunzipped no further than twice the published count: a file past it is refused below all
    // the same, saying by how many records where it is near.
    DecodedSize limit;
    if (records_per_file > 0)
      limit.declared = [&](const uint8_t*) -> DecodedSize::Declared {
        return {static_cast<uint64_t>(2 * records_per_file * record),
                "twice the " + std::to_string(records_per_file) + " records of a published " + f.name + " file"};
      };
    std::vector<uint8_t> raw = read_file_maybe_gzip(path, limit);
    const auto size = static_cast<int64_t>(raw.size());
    HPC_REQUIRE(size > 0 && size % record == 0, "dataset file ", path, " is malformed: ", size,
                " bytes is not a whole number of ", record, "-byte ", f.name, " records",
                size > record ? " (truncated?)" : "");
    const int64_t n = size / record;
    check_record_count(path, n, records_per_file, f);
    const size_t base = d.images.size();
    d.images.resize(base + n * 3 * kPlane);
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t* rec = raw.data() + i * record;
      const uint8_t label = rec[f.label_at];
      HPC_REQUIRE(label < f.classes, "dataset file ", path, ": label ", int{label}, " of record ", i,
                  " is out of range (expected 0..", f.classes - 1, "; is this ", f.name, "?)");
      d.labels.push_back(label);
      const uint8_t* pixels = rec + f.label_bytes;
      uint8_t* out = d.images.data() + base + i * 3 * kPlane;
      for (int64_t p = 0; p < kPlane; ++p)  // planar RGB to interleaved (HWC)
        for (int64_t c = 0; c < 3; ++c) out[p * 3 + c] = pixels[c * kPlane + p];
    }
    d.count += n;
  }
  d.source = paths.empty() ? "" : paths.front();
  return d;
}

}  // namespace

Dataset read_cifar10(const std::vector<std::string>& paths, int64_t records_per_file) {
  return read_cifar(paths, {"CIFAR-10", 1, 0, 10}, records_per_file);
}

Dataset read_cifar100(const std::vector<std::string>& paths, int64_t records_per_file) {
  return read_cifar(paths, {"CIFAR-100", 2, 1, 100}, records_per_file);
}

}  // namespace hpc::data

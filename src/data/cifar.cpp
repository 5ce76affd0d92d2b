// CIFAR-10 binary version: each file is a sequence of 3073-byte records, one label byte
// (0..9) then 1024 red, 1024 green and 1024 blue bytes of a 32x32 image, row-major.
#include "core/error.hpp"
#include "data/dataset.hpp"

namespace hpc::data {

Dataset read_cifar10(const std::vector<std::string>& paths) {
  constexpr int64_t kSide = 32, kPlane = kSide * kSide, kRecord = 1 + 3 * kPlane;
  Dataset d;
  d.height = d.width = kSide;
  d.channels = 3;
  d.classes = 10;
  for (const std::string& path : paths) {
    std::vector<uint8_t> raw = read_file_maybe_gzip(path);
    HPC_REQUIRE(!raw.empty() && raw.size() % kRecord == 0, "dataset file ", path, " is malformed: ", raw.size(),
                " bytes is not a whole number of 3073-byte CIFAR-10 records",
                raw.size() > kRecord ? " (truncated?)" : "");
    const int64_t n = static_cast<int64_t>(raw.size()) / kRecord;
    const size_t base = d.images.size();
    d.images.resize(base + n * 3 * kPlane);
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t* rec = raw.data() + i * kRecord;
      HPC_REQUIRE(rec[0] < 10, "dataset file ", path, ": label ", int{rec[0]}, " of record ", i,
                  " is out of range (expected 0..9)");
      d.labels.push_back(rec[0]);
      uint8_t* out = d.images.data() + base + i * 3 * kPlane;
      for (int64_t p = 0; p < kPlane; ++p)  // planar RGB to interleaved (HWC)
        for (int64_t c = 0; c < 3; ++c) out[p * 3 + c] = rec[1 + c * kPlane + p];
    }
    d.count += n;
  }
  d.source = paths.empty() ? "" : paths.front();
  return d;
}

}  // namespace hpc::data

// Packed image shards (data/shards.hpp) as hpctrain opens and reads them: the header, the footer,
// the index and each record. The index's CRC and, where a version 2 entry's record lies in the
// file, the record's CRC are set right first, so that the search reaches the index's entries and
// the records (ShardReader's tests cover the checksums themselves).
#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "contract.hpp"
#include "data/jpeg.hpp"
#include "data/shards.hpp"

namespace {

uint64_t u64_at(const std::vector<uint8_t>& b, uint64_t at) {
  uint64_t v = 0;
  std::memcpy(&v, b.data() + at, 8);
  return v;
}
uint32_t u32_at(const std::vector<uint8_t>& b, uint64_t at) {
  uint32_t v = 0;
  std::memcpy(&v, b.data() + at, 4);
  return v;
}
uint32_t crc_of(const uint8_t* p, uint64_t n) {
  return static_cast<uint32_t>(crc32(0, p, static_cast<uInt>(n)));
}

// The footer (u64 index offset, u32 count, u32 index CRC, magic) names the index; fix what it
// covers where it lies inside the file.
void fix_checksums(std::vector<uint8_t>& b) {
  using namespace hpc::data;
  const uint64_t size = b.size();
  if (size < kShardHeaderBytes + kShardFooterBytes) return;
  const uint64_t footer = size - kShardFooterBytes;
  const bool v2 = std::memcmp(b.data() + footer + 16, kShardIndexMagic, 8) == 0;
  const uint64_t entry = v2 ? kShardEntryBytes : kShardEntryBytesV1;
  const uint64_t offset = u64_at(b, footer), count = u32_at(b, footer + 8);
  if (offset < kShardHeaderBytes || offset > footer || (footer - offset) / entry < count) return;
  for (uint64_t i = 0; v2 && i < count; ++i) {
    uint8_t* e = b.data() + offset + i * entry;
    uint64_t at = 0;
    uint32_t n = 0;
    std::memcpy(&at, e, 8);
    std::memcpy(&n, e + 8, 4);
    if (at >= kShardHeaderBytes && at <= offset && n <= offset - at) {
      const uint32_t sum = crc_of(b.data() + at, n);
      std::memcpy(e + 16, &sum, 4);
    }
  }
  const uint32_t sum = crc_of(b.data() + offset, count * entry);
  std::memcpy(b.data() + footer + 12, &sum, 4);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hpc;
  std::vector<uint8_t> bytes(data, data + size);
  fix_checksums(bytes);
  const std::string path = fuzz::Scratch::get().write("train-00000-of-00001.hpcs", bytes);
  fuzz::usage_error_or_success([&] {
    const data::ShardReader shard(path, 10);
    std::vector<uint8_t> record;
    for (int64_t i = 0; i < std::min<int64_t>(shard.count(), 16); ++i) {
      if (!fuzz::usage_error_or_success([&] { shard.read(i, record); })) continue;
      fuzz::usage_error_or_success([&] {
        int64_t h = 0, w = 0;
        data::jpeg_size(record, "a record", h, w);
      });
    }
  });
  return 0;
}

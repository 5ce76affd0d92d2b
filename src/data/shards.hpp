// Packed image shards (.hpcs), written by `hpcdata pack`, read with random access by hpctrain.
// A shard holds encoded images back to back and, at its end, an index of where each lies:
//
//   offset 0            "HPCSHRD1"                                   8 bytes
//   8                   record 0, record 1, ... (each a JPEG file's bytes)
//   index_offset        count entries: u64 offset, u32 size, u32 label  16 bytes each
//   file size - 24      u64 index_offset, u32 count, u32 CRC-32 of the index, "HPCSIDX1"
//
// all integers little-endian. A shard is valid only if the footer's magic is there, the index
// fills exactly the space between index_offset and the footer, its CRC matches, and every record
// lies inside the data area: a truncated or overwritten shard fails to open, naming the file.
// A dataset directory holds <split>-NNNNN-of-MMMMM.hpcs for each split (train, val), classes.txt
// (one class name per line; label = line number) and <split>.json (what was packed, for people).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace hpc::data {

inline constexpr char kShardMagic[9] = "HPCSHRD1";
inline constexpr char kShardIndexMagic[9] = "HPCSIDX1";
inline constexpr int64_t kShardHeaderBytes = 8, kShardEntryBytes = 16, kShardFooterBytes = 24;

struct ShardRecord {
  uint64_t offset = 0;
  uint32_t size = 0, label = 0;
};

// Writes one shard to PATH.part and renames it to PATH when finish() has written the index and
// flushed it to storage, so a shard that exists under its name is complete.
class ShardWriter {
 public:
  explicit ShardWriter(std::string path);
  ~ShardWriter();  // an unfinished shard's .part is removed
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;
  void add(std::span<const uint8_t> bytes, uint32_t label);
  void finish();
  int64_t count() const { return static_cast<int64_t>(records_.size()); }

 private:
  std::string path_, part_;
  int fd_ = -1;
  uint64_t offset_ = 0;
  std::vector<ShardRecord> records_;
};

// An open shard: the index in memory, records read with pread (each rank reads only the
// records it samples).
class ShardReader {
 public:
  // classes: labels must be below it (0: not checked).
  explicit ShardReader(std::string path, uint32_t classes = 0);
  ~ShardReader();
  ShardReader(ShardReader&& other) noexcept;
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;
  ShardReader& operator=(ShardReader&&) = delete;
  int64_t count() const { return static_cast<int64_t>(records_.size()); }
  const ShardRecord& record(int64_t i) const { return records_[static_cast<size_t>(i)]; }
  // Reads record i's bytes into out (thread-safe: pread).
  void read(int64_t i, std::vector<uint8_t>& out) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  std::vector<ShardRecord> records_;
};

// The shard files of one split in a packed dataset directory, in order; checks that all M of
// them are there. Empty if the split has none.
std::vector<std::string> list_shards(const std::string& dir, const std::string& split);
// classes.txt: one name per line.
std::vector<std::string> read_class_names(const std::string& dir);
// "<split>-NNNNN-of-MMMMM.hpcs"
std::string shard_name(const std::string& split, int64_t index, int64_t total);

}  // namespace hpc::data

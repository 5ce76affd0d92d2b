// Packed image shards (.hpcs), written by `hpcdata pack`, read with random access by hpctrain.
// A shard holds encoded images back to back and, at its end, an index of where each lies:
//
//   offset 0            "HPCSHRD1"                                   8 bytes
//   8                   record 0, record 1, ... (each a JPEG file's bytes)
//   index_offset        count entries: u64 offset, u32 size, u32 label, u32 CRC-32 of the record
//                                                                    20 bytes each
//   file size - 24      u64 index_offset, u32 count, u32 CRC-32 of the index, "HPCSIDX2"
//
// all integers little-endian. A shard is valid only if the footer's magic is there, the index
// fills exactly the space between index_offset and the footer, its CRC matches, and every record
// lies inside the data area: a truncated or overwritten shard fails to open, naming the file.
// Each record is checked against its CRC when it is read: a flipped bit inside a JPEG's
// entropy-coded data mostly decodes without a word, into another image. Shards written before
// 2026-11-28 end in "HPCSIDX1" and have 16-byte entries without the record's CRC: they are read
// as they are, their records unchecked.
// A dataset directory holds, for each split (train, val), its shards and <split>.json, the
// split's manifest, plus classes.txt (one class name per line; label = line number, for people
// and tools). The manifest is the commit point of a packing: it lists the split's shard files
// and classes, and a packing writes new shards under new names (<split>-gG-NNNNN-of-MMMMM.hpcs,
// G one more than any generation there) before it replaces the manifest with one rename. A
// reader that opens exactly the files the manifest lists never sees a packing in progress, a
// failed one, or a mix of two. Splits packed before manifests listed their shards (version 1)
// are read by their names, <split>-NNNNN-of-MMMMM.hpcs, with classes.txt.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace hpc::data {

inline constexpr char kShardMagic[9] = "HPCSHRD1";
inline constexpr char kShardIndexMagic[9] = "HPCSIDX2";    // entries with the record's CRC
inline constexpr char kShardIndexMagicV1[9] = "HPCSIDX1";  // before 2026-11-28: without
inline constexpr int64_t kShardHeaderBytes = 8, kShardEntryBytes = 20, kShardEntryBytesV1 = 16,
                         kShardFooterBytes = 24;

struct ShardRecord {
  uint64_t offset = 0;
  uint32_t size = 0, label = 0;
  uint32_t crc = 0;  // CRC-32 (zlib's) of the record's bytes; a version 1 shard's: none
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
  // Reads record i's bytes into out (thread-safe: pread), checked against the record's CRC (a
  // usage error naming the shard and record where they differ).
  void read(int64_t i, std::vector<uint8_t>& out) const;
  // Whether the index holds each record's CRC (version 2); version 1 shards' records go unchecked.
  bool checks_records() const { return checks_records_; }
  const std::string& path() const { return path_; }
  uint64_t file_bytes() const { return file_bytes_; }
  uint32_t index_crc() const { return index_crc_; }

 private:
  // The footer and the index, checked (the constructor's work once the file is open).
  void read_index(uint32_t classes);

  std::string path_;
  int fd_ = -1;
  uint64_t file_bytes_ = 0;
  uint32_t index_crc_ = 0;
  bool checks_records_ = true;
  std::vector<ShardRecord> records_;
};

// The version of DIR/<split>.json that hpcdata pack writes (1: before manifests listed their
// shards; read through the shards' names and classes.txt).
inline constexpr int kManifestVersion = 2;

// DIR/<split>.json as a reader needs it.
struct SplitManifest {
  struct Shard {
    std::string name;  // file name in DIR
    uint64_t bytes = 0;
    int64_t records = 0;
    uint32_t index_crc = 0;  // the CRC-32 in the shard's footer
  };
  std::vector<std::string> classes;
  std::vector<Shard> shards;
  int64_t images = 0;
  std::string source;  // the image folder it was packed from, as hpcdata pack recorded it ("": none)
};

// The manifest of a split; nullopt when DIR has no <split>.json or one written before manifests
// listed their shards (version 1). A file that is not such a manifest is a usage error naming it.
std::optional<SplitManifest> read_split_manifest(const std::string& dir, const std::string& split);

// A split opened for reading: its classes and its shards, each checked against the manifest
// (present, the size, record count and index CRC it lists: a shard truncated, overwritten or
// copied from another packing is refused, naming it). A packing that replaces the split while
// this opens it makes it start again from the new manifest. Empty shards: the split has none.
struct OpenSplit {
  std::vector<std::string> classes;
  std::string source;  // SplitManifest::source ("" for a split packed before manifests)
  std::vector<ShardReader> shards;
};
OpenSplit open_split(const std::string& dir, const std::string& split);

// The shard files of a split packed before manifests listed them (<split>-NNNNN-of-MMMMM.hpcs),
// in order; checks that all M of them are there. Empty if the split has none.
std::vector<std::string> list_shards(const std::string& dir, const std::string& split);
// classes.txt: one name per line.
std::vector<std::string> read_class_names(const std::string& dir);
// The classes of the packed dataset in DIR as training reads them (what its labels mean): its train
// split's manifest's, else its val split's, else (splits packed before manifests listed their
// shards) classes.txt's. A classes.txt that says otherwise (edited, or left stale by a packing that
// could not rewrite it) is for people only, and changes nothing.
std::vector<std::string> packed_class_names(const std::string& dir);
// A digest of a class list: the 64-bit FNV-1a (core/hash.hpp) of classes.txt as hpcdata pack writes
// it (each name and a newline), in hex. Checkpoints record it beside the names.
std::string class_names_digest(const std::vector<std::string>& names);
// "<split>-NNNNN-of-MMMMM.hpcs", or with a generation (> 0) "<split>-gG-NNNNN-of-MMMMM.hpcs"
std::string shard_name(const std::string& split, int64_t index, int64_t total, int64_t generation = 0);
// A shard file's name taken apart: <split>-[gG-]NNNNN-of-MMMMM.hpcs[.part], the split without '-',
// '.', '/' or ' ', the numbers of five digits or more (shard_name writes more for 100000 shards or
// more). The digits are kept as written; nullopt for any other name.
struct ShardFileName {
  std::string split;
  std::string generation;  // G's digits; empty: a shard from before manifests listed them
  std::string index, total;
  bool part = false;  // a .part: a shard being written, or left by a packing that was killed
};
std::optional<ShardFileName> parse_shard_file_name(std::string_view name);

}  // namespace hpc::data

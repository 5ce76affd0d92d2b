#include "data/shards.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <utility>

#include "core/error.hpp"

namespace hpc::data {
namespace fs = std::filesystem;
namespace {

void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void write_all(int fd, const uint8_t* data, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    HPC_REQUIRE(w > 0, "cannot write ", path, ": ", std::strerror(errno));
    data += w;
    n -= static_cast<size_t>(w);
  }
}

void pread_all(int fd, uint8_t* data, size_t n, uint64_t offset, const std::string& path) {
  while (n > 0) {
    const ssize_t r = ::pread(fd, data, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    HPC_REQUIRE(r > 0, "cannot read ", path, " at byte ", offset, ": ",
                r == 0 ? "the file ends there (truncated?)" : std::strerror(errno));
    data += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
}

uint32_t crc32_of(const std::vector<uint8_t>& bytes) {
  return static_cast<uint32_t>(::crc32(0L, bytes.data(), static_cast<uInt>(bytes.size())));
}

}  // namespace

std::string shard_name(const std::string& split, int64_t index, int64_t total) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "-%05lld-of-%05lld.hpcs", static_cast<long long>(index), static_cast<long long>(total));
  return split + buf;
}

// ---- writer ------------------------------------------------------------------------------------

ShardWriter::ShardWriter(std::string path) : path_(std::move(path)), part_(path_ + ".part") {
  fd_ = ::open(part_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  HPC_REQUIRE(fd_ >= 0, "cannot create ", part_, ": ", std::strerror(errno));
  write_all(fd_, reinterpret_cast<const uint8_t*>(kShardMagic), kShardHeaderBytes, part_);
  offset_ = kShardHeaderBytes;
}

ShardWriter::~ShardWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(part_.c_str());
  }
}

void ShardWriter::add(std::span<const uint8_t> bytes, uint32_t label) {
  HPC_CHECK(fd_ >= 0, "ShardWriter::add after finish");
  HPC_REQUIRE(!bytes.empty() && bytes.size() <= UINT32_MAX, "a record of ", bytes.size(), " bytes cannot go in a shard");
  HPC_REQUIRE(records_.size() < UINT32_MAX, "shard ", path_, " is full");
  write_all(fd_, bytes.data(), bytes.size(), part_);
  records_.push_back({offset_, static_cast<uint32_t>(bytes.size()), label});
  offset_ += bytes.size();
}

void ShardWriter::finish() {
  HPC_CHECK(fd_ >= 0, "ShardWriter::finish twice");
  std::vector<uint8_t> index(records_.size() * kShardEntryBytes);
  for (size_t i = 0; i < records_.size(); ++i) {
    uint8_t* e = index.data() + i * kShardEntryBytes;
    put_u64(e, records_[i].offset);
    put_u32(e + 8, records_[i].size);
    put_u32(e + 12, records_[i].label);
  }
  uint8_t footer[kShardFooterBytes];
  put_u64(footer, offset_);
  put_u32(footer + 8, static_cast<uint32_t>(records_.size()));
  put_u32(footer + 12, crc32_of(index));
  std::memcpy(footer + 16, kShardIndexMagic, 8);
  write_all(fd_, index.data(), index.size(), part_);
  write_all(fd_, footer, sizeof footer, part_);
  HPC_REQUIRE(::fsync(fd_) == 0, "cannot flush ", part_, ": ", std::strerror(errno));
  ::close(fd_);
  fd_ = -1;
  HPC_REQUIRE(::rename(part_.c_str(), path_.c_str()) == 0, "cannot rename ", part_, " to ", path_, ": ",
              std::strerror(errno));
}

// ---- reader ------------------------------------------------------------------------------------

ShardReader::ShardReader(std::string path, uint32_t classes) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  HPC_REQUIRE(fd_ >= 0, "cannot open shard ", path_, ": ", std::strerror(errno));
  const off_t end = ::lseek(fd_, 0, SEEK_END);
  HPC_REQUIRE(end >= kShardHeaderBytes + kShardFooterBytes, "shard ", path_, " is too short (", end,
              " bytes) to be a shard: truncated?");
  const auto size = static_cast<uint64_t>(end);
  uint8_t head[kShardHeaderBytes], footer[kShardFooterBytes];
  pread_all(fd_, head, sizeof head, 0, path_);
  HPC_REQUIRE(std::memcmp(head, kShardMagic, 8) == 0, path_, " is not an hpcdata shard (no HPCSHRD1 header)");
  pread_all(fd_, footer, sizeof footer, size - kShardFooterBytes, path_);
  HPC_REQUIRE(std::memcmp(footer + 16, kShardIndexMagic, 8) == 0, "shard ", path_,
              " has no index at its end: truncated, or still being written");
  const uint64_t index_offset = get_u64(footer);
  const uint64_t count = get_u32(footer + 8);
  HPC_REQUIRE(index_offset >= kShardHeaderBytes && index_offset + count * kShardEntryBytes + kShardFooterBytes == size,
              "shard ", path_, " has a bad index: ", count, " entries from byte ", index_offset, " do not fit its ", size,
              " bytes");
  std::vector<uint8_t> index(count * kShardEntryBytes);
  if (count) pread_all(fd_, index.data(), index.size(), index_offset, path_);
  HPC_REQUIRE(crc32_of(index) == get_u32(footer + 12), "shard ", path_, " has a corrupt index (CRC mismatch)");
  records_.resize(count);
  for (uint64_t i = 0; i < count; ++i) {
    const uint8_t* e = index.data() + i * kShardEntryBytes;
    ShardRecord& r = records_[i];
    r.offset = get_u64(e);
    r.size = get_u32(e + 8);
    r.label = get_u32(e + 12);
    HPC_REQUIRE(r.size > 0 && r.offset >= kShardHeaderBytes && r.offset + r.size <= index_offset, "shard ", path_,
                ": record ", i, " (", r.size, " bytes at ", r.offset, ") lies outside the data area");
    HPC_REQUIRE(classes == 0 || r.label < classes, "shard ", path_, ": record ", i, " has label ", r.label,
                " but the dataset has ", classes, " classes");
  }
}

ShardReader::~ShardReader() {
  if (fd_ >= 0) ::close(fd_);
}

ShardReader::ShardReader(ShardReader&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)), records_(std::move(other.records_)) {}

void ShardReader::read(int64_t i, std::vector<uint8_t>& out) const {
  const ShardRecord& r = record(i);
  out.resize(r.size);
  pread_all(fd_, out.data(), r.size, r.offset, path_);
}

// ---- dataset directory -------------------------------------------------------------------------

std::vector<std::string> list_shards(const std::string& dir, const std::string& split) {
  const std::regex pattern(split + R"(-(\d{5})-of-(\d{5})\.hpcs)");
  std::vector<std::pair<int64_t, std::string>> found;
  int64_t total = -1;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (!std::regex_match(name, m, pattern)) continue;
    const int64_t of = std::stoll(m[2]);
    HPC_REQUIRE(total < 0 || of == total, "shards of split ", split, " in ", dir, " disagree on their number (", of,
                " and ", total, "): files from two packings?");
    total = of;
    found.emplace_back(std::stoll(m[1]), entry.path().string());
  }
  HPC_REQUIRE(!ec, "cannot list ", dir, ": ", ec.message());
  std::sort(found.begin(), found.end());
  for (int64_t i = 0; i < static_cast<int64_t>(found.size()); ++i)
    HPC_REQUIRE(found[i].first == i, "shard ", shard_name(split, i, total), " is missing from ", dir);
  HPC_REQUIRE(static_cast<int64_t>(found.size()) == std::max<int64_t>(total, 0), "shard ",
              shard_name(split, static_cast<int64_t>(found.size()), total), " is missing from ", dir);
  std::vector<std::string> paths;
  for (auto& f : found) paths.push_back(std::move(f.second));
  return paths;
}

std::vector<std::string> read_class_names(const std::string& dir) {
  const std::string path = (fs::path(dir) / "classes.txt").string();
  std::ifstream in(path);
  HPC_REQUIRE(in, "cannot read ", path, " (a packed dataset lists its classes there)");
  std::vector<std::string> names;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    HPC_REQUIRE(!line.empty(), path, ": line ", names.size() + 1, " is empty");
    names.push_back(line);
  }
  HPC_REQUIRE(!names.empty(), path, " lists no classes");
  return names;
}

}  // namespace hpc::data

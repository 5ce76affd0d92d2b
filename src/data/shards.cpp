#include "data/shards.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <isa-l/crc.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <utility>

#include "core/error.hpp"
#include "core/file_identity.hpp"
#include "core/hash.hpp"

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

// The CRC-32 of the index and of each record: zlib's (ISA-L's gzip CRC, the same value several
// times faster: every record read is checked).
uint32_t crc32_of(const uint8_t* data, size_t n) { return crc32_gzip_refl(0, data, n); }
uint32_t crc32_of(const std::vector<uint8_t>& bytes) { return crc32_of(bytes.data(), bytes.size()); }

}  // namespace

std::string shard_name(const std::string& split, int64_t index, int64_t total, int64_t generation) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "-%05lld-of-%05lld.hpcs", static_cast<long long>(index), static_cast<long long>(total));
  return split + (generation > 0 ? "-g" + std::to_string(generation) : "") + buf;
}

namespace {

// Takes the digits at the front of REST into DIGITS (nothing when there are none).
void take_digits(std::string_view& rest, std::string& digits) {
  size_t n = 0;
  while (n < rest.size() && rest[n] >= '0' && rest[n] <= '9') ++n;
  digits.assign(rest.substr(0, n));
  rest.remove_prefix(n);
}

bool take(std::string_view& rest, std::string_view word) {
  if (!rest.starts_with(word)) return false;
  rest.remove_prefix(word.size());
  return true;
}

}  // namespace

std::optional<ShardFileName> parse_shard_file_name(std::string_view name) {
  ShardFileName f;
  const size_t dash = name.find('-');
  if (dash == 0 || dash == std::string_view::npos) return std::nullopt;
  f.split.assign(name.substr(0, dash));
  if (f.split.find_first_of("./ ") != std::string::npos) return std::nullopt;
  std::string_view rest = name.substr(dash + 1);
  if (take(rest, "g")) {
    take_digits(rest, f.generation);
    if (f.generation.empty() || !take(rest, "-")) return std::nullopt;
  }
  take_digits(rest, f.index);
  if (f.index.size() < 5 || !take(rest, "-of-")) return std::nullopt;
  take_digits(rest, f.total);
  if (f.total.size() < 5 || !take(rest, ".hpcs")) return std::nullopt;
  f.part = take(rest, ".part");
  if (!rest.empty()) return std::nullopt;
  return f;
}

// ---- writer ------------------------------------------------------------------------------------

ShardWriter::ShardWriter(std::string path) : path_(std::move(path)), part_(path_ + ".part") {
  fd_ = create_new_file(part_);  // never through a link or into a file planted under the name
  HPC_REQUIRE(fd_ >= 0, "cannot create ", part_, ": ", std::strerror(errno));
  try {
    write_all(fd_, reinterpret_cast<const uint8_t*>(kShardMagic), kShardHeaderBytes, part_);
  } catch (...) {  // (a constructor that throws runs no destructor: its clean-up, here)
    ::close(std::exchange(fd_, -1));
    ::unlink(part_.c_str());
    throw;
  }
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
  records_.push_back({offset_, static_cast<uint32_t>(bytes.size()), label, crc32_of(bytes.data(), bytes.size())});
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
    put_u32(e + 16, records_[i].crc);
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
  if (::rename(part_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(part_.c_str());  // (the destructor no longer does: the file is closed)
    usage_error("cannot rename ", part_, " to ", path_, ": ", std::strerror(err));
  }
}

// ---- reader ------------------------------------------------------------------------------------

ShardReader::ShardReader(std::string path, uint32_t classes) : path_(std::move(path)) {
  fd_ = open_data_file(path_, "shard");
  try {
    read_index(classes);
  } catch (...) {
    // A constructor that throws runs no destructor: each damaged shard refused kept its file
    // open (a process that goes on, as a test or a fuzz run does, ran out of descriptors).
    ::close(std::exchange(fd_, -1));
    throw;
  }
}

void ShardReader::read_index(uint32_t classes) {
  const off_t end = ::lseek(fd_, 0, SEEK_END);
  HPC_REQUIRE(end >= kShardHeaderBytes + kShardFooterBytes, "shard ", path_, " is too short (", end,
              " bytes) to be a shard: truncated?");
  const auto size = static_cast<uint64_t>(end);
  file_bytes_ = size;
  uint8_t head[kShardHeaderBytes], footer[kShardFooterBytes];
  pread_all(fd_, head, sizeof head, 0, path_);
  HPC_REQUIRE(std::memcmp(head, kShardMagic, 8) == 0, path_, " is not an hpcdata shard (no HPCSHRD1 header)");
  pread_all(fd_, footer, sizeof footer, size - kShardFooterBytes, path_);
  checks_records_ = std::memcmp(footer + 16, kShardIndexMagic, 8) == 0;
  HPC_REQUIRE(checks_records_ || std::memcmp(footer + 16, kShardIndexMagicV1, 8) == 0, "shard ", path_,
              " has no index at its end: truncated, or still being written");
  const uint64_t entry_bytes = checks_records_ ? kShardEntryBytes : kShardEntryBytesV1;
  const uint64_t index_offset = get_u64(footer);
  const uint64_t count = get_u32(footer + 8);
  // (Without a sum that can wrap: an index_offset near 2^64 made it fit, and the index read
  // below asked for up to 86 GB.)
  HPC_REQUIRE(index_offset >= kShardHeaderBytes && index_offset <= size - kShardFooterBytes &&
                  size - kShardFooterBytes - index_offset == count * entry_bytes,
              "shard ", path_, " has a bad index: ", count, " entries from byte ", index_offset, " do not fit its ", size,
              " bytes");
  std::vector<uint8_t> index(count * entry_bytes);
  if (count) pread_all(fd_, index.data(), index.size(), index_offset, path_);
  index_crc_ = get_u32(footer + 12);
  HPC_REQUIRE(crc32_of(index) == index_crc_, "shard ", path_, " has a corrupt index (CRC mismatch)");
  records_.resize(count);
  for (uint64_t i = 0; i < count; ++i) {
    const uint8_t* e = index.data() + i * entry_bytes;
    ShardRecord& r = records_[i];
    r.offset = get_u64(e);
    r.size = get_u32(e + 8);
    r.label = get_u32(e + 12);
    if (checks_records_) r.crc = get_u32(e + 16);
    HPC_REQUIRE(r.size > 0 && r.offset >= kShardHeaderBytes && r.offset <= index_offset &&
                    r.size <= index_offset - r.offset,
                "shard ", path_,
                ": record ", i, " (", r.size, " bytes at ", r.offset, ") lies outside the data area");
    HPC_REQUIRE(classes == 0 || r.label < classes, "shard ", path_, ": record ", i, " has label ", r.label,
                " but the dataset has ", classes, " classes");
  }
}

ShardReader::~ShardReader() {
  if (fd_ >= 0) ::close(fd_);
}

ShardReader::ShardReader(ShardReader&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      file_bytes_(other.file_bytes_),
      index_crc_(other.index_crc_),
      checks_records_(other.checks_records_),
      records_(std::move(other.records_)) {}

void ShardReader::read(int64_t i, std::vector<uint8_t>& out) const {
  const ShardRecord& r = record(i);
  out.resize(r.size);
  pread_all(fd_, out.data(), r.size, r.offset, path_);
  HPC_REQUIRE(!checks_records_ || crc32_of(out) == r.crc, "shard ", path_, " record ", i,
              " is damaged (its CRC-32 is not the index's): the file changed since it was packed, or was copied or "
              "stored with errors; stage or pack it again");
}

// ---- dataset directory -------------------------------------------------------------------------

std::vector<std::string> list_shards(const std::string& dir, const std::string& split) {
  std::vector<std::pair<int64_t, std::string>> found;
  int64_t total = -1;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const auto m = parse_shard_file_name(entry.path().filename().string());
    if (!m || m->split != split || !m->generation.empty() || m->part || m->index.size() > 18 || m->total.size() > 18)
      continue;
    const int64_t of = std::stoll(m->total);
    HPC_REQUIRE(total < 0 || of == total, "shards of split ", split, " in ", dir, " disagree on their number (", of,
                " and ", total, "): files from two packings?");
    total = of;
    found.emplace_back(std::stoll(m->index), entry.path().string());
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

namespace {

// Each class once: a name twice would give two labels one name (and predict one answer two ways).
void require_distinct_classes(const std::vector<std::string>& names, const std::string& where) {
  std::set<std::string> seen;
  for (const std::string& name : names)
    HPC_REQUIRE(seen.insert(name).second, where, " names the class '", one_line(name), "' twice");
}

// A dataset's small text file (a manifest, the class list), whole: a regular file only, at most
// kMostTextBytes (a manifest of a million shards is far less).
constexpr int64_t kMostTextBytes = int64_t{256} << 20;
std::string read_text(const std::string& path, const char* what) {
  const std::vector<uint8_t> bytes = read_data_file(path, what, kMostTextBytes);
  return std::string(bytes.begin(), bytes.end());
}

}  // namespace

std::vector<std::string> read_class_names(const std::string& dir) {
  const std::string path = (fs::path(dir) / "classes.txt").string();
  std::error_code ec;
  HPC_REQUIRE(fs::exists(path, ec), "cannot read ", path, " (a packed dataset lists its classes there)");
  std::istringstream in(read_text(path, "the list of the packed dataset's classes"));
  std::vector<std::string> names;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    HPC_REQUIRE(!line.empty(), path, ": line ", names.size() + 1, " is empty");
    names.push_back(line);
  }
  HPC_REQUIRE(!names.empty(), path, " lists no classes");
  require_distinct_classes(names, path);
  return names;
}

std::string class_names_digest(const std::vector<std::string>& names) {
  std::string text;
  for (const std::string& name : names) text += name + '\n';
  return fnv1a_hex(text.data(), text.size());
}

// ---- manifests ---------------------------------------------------------------------------------

namespace {


// What a JSON error says, without the library's "[json.exception.type_error.302] " prefix.
std::string json_problem(const nlohmann::json::exception& e) {
  const std::string what = e.what();
  const size_t end = what.find("] ");
  return what.rfind("[json.exception.", 0) == 0 && end != std::string::npos ? what.substr(end + 2) : what;
}

std::string parse_problem(const nlohmann::json::parse_error& e) {
  const std::string what = json_problem(e);
  const size_t at = what.find(": ");  // "parse error at line 1, column 5: syntax error ..."
  return at != std::string::npos ? what.substr(at + 2) : what;
}

// A member an object must have: "no NAME" when it has none.
const nlohmann::json& field(const nlohmann::json& object, const char* name) {
  if (!object.is_object() || !object.contains(name))
    throw nlohmann::json::out_of_range::create(403, std::string("no ") + name, &object);
  return object.at(name);
}

// A member that is a whole number from 0 to `most`, or the manifest is refused
// ("images is not a whole number from 0 to ...") rather than read wrapped around, as get<int64_t>()
// reads 2^64 - 1.
uint64_t whole_field(const nlohmann::json& object, const char* name,
                     uint64_t most = static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
  const nlohmann::json& v = field(object, name);
  if (!v.is_number_unsigned() || v.get<uint64_t>() > most)
    throw nlohmann::json::type_error::create(302, std::string(name) + " is not a whole number from 0 to " + std::to_string(most),
                                             &object);
  return v.get<uint64_t>();
}

// The manifest's text, "" when there is none.
std::string manifest_text(const std::string& dir, const std::string& split) {
  const std::string path = (fs::path(dir) / (split + ".json")).string();
  std::error_code ec;
  if (!fs::exists(path, ec)) return "";
  std::string text = read_text(path, "a manifest of packed shards");
  // hpcdata pack renames a whole manifest into place: an empty one was cut short or emptied,
  // not "no shards" (which sent the reader to pack a split it had packed).
  HPC_REQUIRE(!text.empty(), path, " is empty (cut short, or emptied?): pack the split again");
  return text;
}

std::optional<SplitManifest> parse_manifest(const std::string& text, const std::string& path,
                                            const std::string& split) {
  nlohmann::json tree;
  try {
    tree = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    usage_error(path, " is not a packed split's manifest (byte ", e.byte, ": ", parse_problem(e),
                "): overwritten? pack the split again");
  } catch (const nlohmann::json::exception& e) {  // a number past a double's range (out_of_range 406)
    usage_error(path, " is not a packed split's manifest (", json_problem(e), "): overwritten? pack the split again");
  }
  const bool ours = tree.is_object() && tree.value("format", nlohmann::json()) == "hpcdata shards" &&
                    tree.value("split", nlohmann::json()) == split;
  HPC_REQUIRE(ours, path, " is not the manifest of the packed split '", split, "' (written by hpcdata pack)");
  const nlohmann::json& version = tree.value("version", nlohmann::json(0));
  HPC_REQUIRE(version.is_number_integer(), path, " has a version that is not a whole number (", version.dump(),
              "): overwritten? pack the split again");
  if (version.get<int64_t>() < 2) return std::nullopt;
  HPC_REQUIRE(version.get<int64_t>() == kManifestVersion, path, " is a manifest of version ", version.get<int64_t>(),
              ", and this hpctrain reads versions 1 and ", kManifestVersion, ": a newer hpcdata pack wrote it?");
  try {
    SplitManifest m;
    for (const auto& c : field(tree, "class_names")) m.classes.push_back(c.get<std::string>());
    for (const auto& f : field(tree, "shard_files"))
      m.shards.push_back({field(f, "name").get<std::string>(), whole_field(f, "bytes", UINT64_MAX),
                          static_cast<int64_t>(whole_field(f, "records")),
                          static_cast<uint32_t>(whole_field(f, "index_crc32", UINT32_MAX))});
    m.images = static_cast<int64_t>(whole_field(tree, "images"));
    if (const auto s = tree.find("source"); s != tree.end() && s->is_string()) m.source = s->get<std::string>();
    std::set<std::string> listed;
    for (const SplitManifest::Shard& s : m.shards) {
      HPC_REQUIRE(!s.name.empty() && s.name.find('/') == std::string::npos && s.name.ends_with(".hpcs"), path,
                  " lists '", s.name, "', which is no shard file name");
      HPC_REQUIRE(listed.insert(s.name).second, path, " lists the shard ", s.name, " twice: its images would be "
                  "read twice (edited by hand? pack the split again)");
    }
    HPC_REQUIRE(!m.classes.empty(), path, " lists no classes");
    require_distinct_classes(m.classes, path);
    // (A count that is not a whole number, 1e300, is a wrong count: read as one, it was a float
    // converted to an integer it does not fit, which is undefined.)
    const nlohmann::json counted = tree.value("classes", nlohmann::json(m.classes.size()));
    HPC_REQUIRE(counted.is_number_unsigned() && counted.get<uint64_t>() == m.classes.size(), path, " counts ",
                counted.dump(), " classes but names ", m.classes.size());
    return m;
  } catch (const nlohmann::json::exception& e) {
    usage_error(path, " is not a complete packed split's manifest (", json_problem(e), "): pack the split again");
  }
}

// Opens the shards a manifest lists, each checked against its entry.
std::vector<ShardReader> open_listed(const std::string& dir, const SplitManifest& m, const std::string& manifest) {
  std::vector<ShardReader> shards;
  int64_t images = 0;
  for (const SplitManifest::Shard& s : m.shards) {
    const std::string path = (fs::path(dir) / s.name).string();
    std::error_code ec;
    HPC_REQUIRE(fs::exists(path, ec), manifest, " lists ", s.name, ", which is missing from ", dir,
                ": restore it or pack the split again");
    ShardReader& r = shards.emplace_back(path, static_cast<uint32_t>(m.classes.size()));
    HPC_REQUIRE(r.file_bytes() == s.bytes, "shard ", path, " is ", r.file_bytes(), " bytes where ", manifest,
                " lists ", s.bytes, ": changed since it was packed (pack the split again)");
    HPC_REQUIRE(r.count() == s.records && r.index_crc() == s.index_crc, "shard ", path,
                " is not the one ", manifest, " lists (its index differs): a shard from another packing?");
    images += r.count();
  }
  HPC_REQUIRE(images == m.images, manifest, " counts ", m.images, " images but its shards hold ", images);
  return shards;
}

// The split's shards of a packing's generation (<split>-gG-NNNNN-of-MMMMM.hpcs), sorted: only a
// manifest lists which of them are the split.
std::vector<std::string> generation_shards(const std::string& dir, const std::string& split) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const auto m = parse_shard_file_name(name);
    if (m && m->split == split && !m->generation.empty() && !m->part) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// manifest_there: a manifest of version 1 (which lists no shards), else none.
OpenSplit open_legacy(const std::string& dir, const std::string& split, bool manifest_there) {
  OpenSplit open;
  const std::vector<std::string> paths = list_shards(dir, split);
  if (paths.empty()) {
    // Shards of a packing without its manifest (deleted, not copied, not staged): "no shards, pack
    // them" sent the reader to pack a split whose shards are there.
    const std::vector<std::string> orphans = generation_shards(dir, split);
    HPC_REQUIRE(orphans.empty(), "the manifest ", (fs::path(dir) / (split + ".json")).string(),
                manifest_there ? " is of version 1 (it lists no shards)" : " is missing", ", but ",
                orphans.size(), " ", split, " shard(s) are in ", dir, " (", orphans.front(),
                orphans.size() > 1 ? ", ..." : "", "): the split's shards are read from the list in its manifest; "
                "restore it (copy it with the shards), or pack the split again");
    return open;
  }
  open.classes = read_class_names(dir);
  for (const std::string& p : paths) open.shards.emplace_back(p, static_cast<uint32_t>(open.classes.size()));
  return open;
}

}  // namespace

std::optional<SplitManifest> read_split_manifest(const std::string& dir, const std::string& split) {
  const std::string text = manifest_text(dir, split);
  if (text.empty()) return std::nullopt;
  return parse_manifest(text, (fs::path(dir) / (split + ".json")).string(), split);
}

std::vector<std::string> packed_class_names(const std::string& dir) {
  for (const char* split : {"train", "val"})
    if (const std::optional<SplitManifest> m = read_split_manifest(dir, split)) return m->classes;
  return read_class_names(dir);
}

OpenSplit open_split(const std::string& dir, const std::string& split) {
  const std::string path = (fs::path(dir) / (split + ".json")).string();
  // A packing may replace the manifest (and delete the shards it listed) while this reads them:
  // then the manifest's text has changed, and reading starts again from the new one.
  for (int attempt = 0;; ++attempt) {
    const std::string text = manifest_text(dir, split);
    try {
      const std::optional<SplitManifest> m = text.empty() ? std::nullopt : parse_manifest(text, path, split);
      if (!m) return open_legacy(dir, split, !text.empty());
      return {m->classes, m->source, open_listed(dir, *m, path)};
    } catch (const Error&) {
      if (attempt < 3 && manifest_text(dir, split) != text) continue;
      throw;
    }
  }
}

}  // namespace hpc::data

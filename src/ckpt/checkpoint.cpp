#include "ckpt/checkpoint.hpp"

#include <isa-l/crc.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <sstream>

#include "core/error.hpp"

namespace hpc::ckpt {
namespace {

constexpr char kMagic[kMagicBytes] = {'H', 'P', 'C', 'T', 'C', 'K', 'P', 'T'};
enum Kind : uint32_t { Meta = 1, Params = 2, Momentum = 3, Buffers = 4, End = 0xE0Fu };

// zlib's CRC-32 (crc32(0, p, n)), by ISA-L: folded with carry-less multiplies, an order of
// magnitude faster, which the writer of a snapshot every step needs.
uint32_t crc(const char* p, size_t n) { return crc32_gzip_refl(0, reinterpret_cast<const unsigned char*>(p), n); }

template <class V>
void put(std::vector<char>& out, V v) {
  const char* p = reinterpret_cast<const char*>(&v);
  out.insert(out.end(), p, p + sizeof v);
}

const char* kind_name(uint32_t kind) {
  switch (kind) {
    case Meta: return "meta";
    case Params: return "parameters";
    case Momentum: return "optimizer state";
    case Buffers: return "batch-norm statistics";
    default: return "unknown";
  }
}

}  // namespace

int64_t Checkpoint::integer(const std::string& key) const {
  const std::string& v = text(key);
  try {
    size_t used = 0;
    const long long x = std::stoll(v, &used);
    if (used == v.size()) return x;
  } catch (const std::exception&) {
  }
  usage_error("checkpoint field ", key, " is not an integer: '", v, "'");
}

double Checkpoint::number(const std::string& key) const {
  const std::string& v = text(key);
  try {
    size_t used = 0;
    const double x = std::stod(v, &used);
    if (used == v.size()) return x;
  } catch (const std::exception&) {
  }
  usage_error("checkpoint field ", key, " is not a number: '", v, "'");
}

const std::string& Checkpoint::text(const std::string& key) const {
  auto it = meta.find(key);
  HPC_REQUIRE(it != meta.end(), "the checkpoint has no field ", key);
  return it->second;
}

void require_finite_state(const Checkpoint& c, const std::string& path) {
  for (const std::vector<float>* v : {&c.params, &c.buffers})
    for (float x : *v) HPC_REQUIRE(std::isfinite(x), "the checkpoint ", path, " holds parameters that are not finite");
}

namespace {
// The meta section's text: one key=value line each.
std::string meta_text(const Checkpoint& c) {
  std::ostringstream m;
  for (const auto& [k, v] : c.meta) {
    HPC_CHECK(k.find_first_of("=\n") == std::string::npos && v.find('\n') == std::string::npos,
              "checkpoint meta field '", k, "' cannot be written as a line");
    m << k << '=' << v << '\n';
  }
  return m.str();
}

constexpr size_t kFileHeadBytes = kMagicBytes + sizeof(uint32_t);                     // magic, version
constexpr size_t kSectionHeadBytes = sizeof(uint32_t) + sizeof(uint64_t) + sizeof(uint32_t);  // kind, n, CRC
constexpr size_t kSections = 5;                                                      // 4 and the end
}  // namespace

Encoded::Encoded(const Checkpoint& c) : meta_(meta_text(c)) {
  const ByteSpan payloads[kSections] = {
      {meta_.data(), meta_.size()},
      {reinterpret_cast<const char*>(c.params.data()), c.params.size() * sizeof(float)},
      {reinterpret_cast<const char*>(c.momentum.data()), c.momentum.size() * sizeof(float)},
      {reinterpret_cast<const char*>(c.buffers.data()), c.buffers.size() * sizeof(float)},
      {nullptr, 0}};
  const uint32_t kinds[kSections] = {Meta, Params, Momentum, Buffers, End};
  heads_.reserve(kFileHeadBytes + kSections * kSectionHeadBytes);
  heads_.insert(heads_.end(), kMagic, kMagic + sizeof kMagic);
  put(heads_, kFormatVersion);
  for (size_t i = 0; i < kSections; ++i) {
    put(heads_, kinds[i]);
    put(heads_, static_cast<uint64_t>(payloads[i].size));
    put(heads_, crc(payloads[i].data, payloads[i].size));
  }
  // heads_ is complete: its pieces' pointers stay valid.
  pieces_.push_back({heads_.data(), kFileHeadBytes});
  for (size_t i = 0; i < kSections; ++i) {
    pieces_.push_back({heads_.data() + kFileHeadBytes + i * kSectionHeadBytes, kSectionHeadBytes});
    if (payloads[i].size > 0) pieces_.push_back(payloads[i]);
  }
  for (const ByteSpan& p : pieces_) size_ += p.size;
}

size_t encoded_size(const Checkpoint& c) {
  return kFileHeadBytes + kSections * kSectionHeadBytes + meta_text(c).size() +
         (c.params.size() + c.momentum.size() + c.buffers.size()) * sizeof(float);
}

std::vector<char> encode(const Checkpoint& c) {
  std::vector<char> out;
  encode(c, out);
  return out;
}

void encode(const Checkpoint& c, std::vector<char>& out) {
  const Encoded e(c);
  out.clear();
  out.reserve(e.size());
  for (const ByteSpan& p : e.pieces()) out.insert(out.end(), p.data, p.data + p.size);
}

namespace {
// An intact meta section's KEY=VALUE lines into c.
void read_meta(const std::string& text, const std::string& what, Checkpoint& c) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    HPC_REQUIRE(eq != std::string::npos, what, ": malformed meta line '", line, "'");
    c.meta[line.substr(0, eq)] = line.substr(eq + 1);
  }
}

struct SectionHead {
  uint32_t kind;
  uint64_t n;
  uint32_t sum;  // the CRC of its n bytes
};

// An arena section's n bytes read in pieces of at most 1 MiB, kept nowhere: their CRC-32.
uint32_t crc_of_streamed(const std::function<void(char*, size_t)>& read, uint64_t n) {
  std::vector<char> piece(static_cast<size_t>(std::min<uint64_t>(n, uint64_t{1} << 20)));
  uint32_t sum = crc(nullptr, 0);
  for (uint64_t left = n; left > 0;) {
    const size_t k = static_cast<size_t>(std::min<uint64_t>(left, piece.size()));
    read(piece.data(), k);
    sum = crc32_gzip_refl(sum, reinterpret_cast<const unsigned char*>(piece.data()), k);
    left -= k;
  }
  return sum;
}

// A section's bytes from read, straight into their place in c (with Arenas::Check, an arena's
// bytes stream past and none are kept), then checked (`what` is the file, of `size` bytes).
void read_section(const SectionHead& head, const std::function<void(char*, size_t)>& read, const std::string& what,
                  uint64_t size, Checkpoint& c, Layout& layout, Arenas arenas) {
  const auto [kind, n, sum] = head;
  HPC_REQUIRE(kind == Meta || n % sizeof(float) == 0, what, ": the ", kind_name(kind),
              " section is not a whole number of floats");
  std::string text;
  uint32_t got = 0;  // the CRC of what was read
  if (kind != Meta && arenas == Arenas::Check) {
    got = crc_of_streamed(read, n);
  } else {
    char* dst = nullptr;
    try {
      if (kind == Meta) {
        text.resize(n);
        dst = text.data();
      } else {
        std::vector<float>& v = kind == Params ? c.params : kind == Momentum ? c.momentum : c.buffers;
        v.resize(n / sizeof(float));
        dst = reinterpret_cast<char*>(v.data());
      }
    } catch (const std::bad_alloc&) {
      throw CheckpointTooLarge(
          detail::concat("cannot read ", what, ": its ", size, " bytes do not fit in this process's memory"), size);
    }
    read(dst, n);
    got = crc(dst, n);
  }
  const bool intact = got == sum;
  layout.sections.push_back({kind_name(kind), n, intact});
  HPC_REQUIRE(intact, what, " is corrupt (checksum mismatch in its ", kind_name(kind), " section)");
  if (kind == Meta) {
    read_meta(text, what, c);
    layout.meta = c.meta;
  }
}
}  // namespace

Checkpoint decode(uint64_t size, const std::function<void(char*, size_t)>& read, const std::string& what,
                  Layout* layout, Arenas arenas) {
  Layout ignored;
  Layout& seen_layout = layout ? *layout : ignored;
  size_t at = 0;
  auto need = [&](size_t n, const char* part) {
    HPC_REQUIRE(size - at >= n, what, " is truncated (", size, " bytes; it ends inside the ", part, ")");
  };
  auto get = [&](auto& v, const char* part) {
    need(sizeof v, part);
    read(reinterpret_cast<char*>(&v), sizeof v);
    at += sizeof v;
  };
  char magic[sizeof kMagic];
  need(sizeof kMagic, "header");
  read(magic, sizeof magic);
  HPC_REQUIRE(std::memcmp(magic, kMagic, sizeof kMagic) == 0, what, " is not an hpctrain checkpoint (wrong magic)");
  at += sizeof kMagic;
  uint32_t version = 0;
  get(version, "header");
  seen_layout.version = version;
  if (version > kFormatVersion)
    throw NewerFormatCheckpoint(detail::concat(what, " has checkpoint format version ", version, "; this hpctrain reads ",
                                               "version ", kFormatVersion, " (written by a newer hpctrain?)"));
  HPC_REQUIRE(version == kFormatVersion, what, " has checkpoint format version ", version, "; this hpctrain reads version ",
              kFormatVersion);
  Checkpoint c;
  bool seen[5] = {false, false, false, false, false};
  for (;;) {
    uint32_t kind = 0, sum = 0;
    uint64_t n = 0;
    get(kind, "section header");
    get(n, "section header");
    get(sum, "section header");
    if (kind == End) {
      HPC_REQUIRE(n == 0 && sum == crc(nullptr, 0), what, " is corrupt (damaged end marker)");
      break;
    }
    HPC_REQUIRE(kind >= Meta && kind <= Buffers, what, " has a section of unknown kind ", kind, " at byte ", at);
    HPC_REQUIRE(!seen[kind], what, " has its ", kind_name(kind), " section twice");
    seen[kind] = true;
    HPC_REQUIRE(n <= size - at, what, " is truncated (its ", kind_name(kind), " section should hold ", n, " bytes, ",
                size - at, " are left)");
    read_section({kind, n, sum}, read, what, size, c, seen_layout, arenas);
    at += n;
  }
  for (uint32_t k = Meta; k <= Buffers; ++k)
    HPC_REQUIRE(seen[k], what, " has no ", kind_name(k), " section");
  HPC_REQUIRE(at == size, what, " has ", size - at, " stray bytes after its end");
  return c;
}

Checkpoint decode(const std::vector<char>& bytes, const std::string& what, Layout* layout) {
  size_t at = 0;
  auto read = [&](char* dst, size_t n) {
    if (n) std::memcpy(dst, bytes.data() + at, n);  // an empty section's dst may be null
    at += n;
  };
  return decode(bytes.size(), read, what, layout);
}

}  // namespace hpc::ckpt

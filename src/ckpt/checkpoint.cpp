#include "ckpt/checkpoint.hpp"

#include <isa-l/crc.h>

#include <cmath>
#include <cstring>
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

void put_section(std::vector<char>& out, uint32_t kind, const char* data, size_t n) {
  put(out, kind);
  put(out, static_cast<uint64_t>(n));
  put(out, crc(data, n));
  out.insert(out.end(), data, data + n);
}

void put_floats(std::vector<char>& out, uint32_t kind, const std::vector<float>& v) {
  put_section(out, kind, reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
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

bool is_checkpoint_magic(const std::vector<char>& bytes) {
  return bytes.size() >= sizeof kMagic && std::memcmp(bytes.data(), kMagic, sizeof kMagic) == 0;
}

void require_finite_state(const Checkpoint& c, const std::string& path) {
  for (const std::vector<float>* v : {&c.params, &c.buffers})
    for (float x : *v) HPC_REQUIRE(std::isfinite(x), "the checkpoint ", path, " holds parameters that are not finite");
}

std::vector<char> encode(const Checkpoint& c) {
  std::vector<char> out;
  encode(c, out);
  return out;
}

void encode(const Checkpoint& c, std::vector<char>& out) {
  std::ostringstream m;
  for (const auto& [k, v] : c.meta) {
    HPC_CHECK(k.find_first_of("=\n") == std::string::npos && v.find('\n') == std::string::npos,
              "checkpoint meta field '", k, "' cannot be written as a line");
    m << k << '=' << v << '\n';
  }
  const std::string meta = m.str();
  out.clear();
  out.reserve(64 + meta.size() + (c.params.size() + c.momentum.size() + c.buffers.size()) * sizeof(float));
  out.insert(out.end(), kMagic, kMagic + sizeof kMagic);
  put(out, kFormatVersion);
  put_section(out, Meta, meta.data(), meta.size());
  put_floats(out, Params, c.params);
  put_floats(out, Momentum, c.momentum);
  put_floats(out, Buffers, c.buffers);
  put_section(out, End, nullptr, 0);
}

namespace {
// An intact section's n bytes at p into c: the meta's KEY=VALUE lines, or a section of floats.
void read_section(uint32_t kind, const char* p, uint64_t n, const std::string& what, Checkpoint& c) {
  if (kind == Meta) {
    std::istringstream in(std::string(p, n));
    std::string line;
    while (std::getline(in, line)) {
      const size_t eq = line.find('=');
      HPC_REQUIRE(eq != std::string::npos, what, ": malformed meta line '", line, "'");
      c.meta[line.substr(0, eq)] = line.substr(eq + 1);
    }
    return;
  }
  HPC_REQUIRE(n % sizeof(float) == 0, what, ": the ", kind_name(kind), " section is not a whole number of floats");
  std::vector<float>& dst = kind == Params ? c.params : kind == Momentum ? c.momentum : c.buffers;
  dst.resize(n / sizeof(float));
  if (n) std::memcpy(dst.data(), p, n);  // an empty section's data() may be null
}
}  // namespace

Checkpoint decode(const std::vector<char>& bytes, const std::string& what, Layout* layout) {
  Layout ignored;
  Layout& seen_layout = layout ? *layout : ignored;
  size_t at = 0;
  auto need = [&](size_t n, const char* part) {
    HPC_REQUIRE(bytes.size() - at >= n, what, " is truncated (", bytes.size(), " bytes; it ends inside the ", part, ")");
  };
  auto get = [&](auto& v, const char* part) {
    need(sizeof v, part);
    std::memcpy(&v, bytes.data() + at, sizeof v);
    at += sizeof v;
  };
  need(sizeof kMagic, "header");
  HPC_REQUIRE(std::memcmp(bytes.data(), kMagic, sizeof kMagic) == 0, what, " is not an hpctrain checkpoint (wrong magic)");
  at += sizeof kMagic;
  uint32_t version = 0;
  get(version, "header");
  seen_layout.version = version;
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
    HPC_REQUIRE(n <= bytes.size() - at, what, " is truncated (its ", kind_name(kind), " section should hold ", n,
                " bytes, ", bytes.size() - at, " are left)");
    const char* p = bytes.data() + at;
    const bool intact = crc(p, n) == sum;
    seen_layout.sections.push_back({kind_name(kind), n, intact});
    HPC_REQUIRE(intact, what, " is corrupt (checksum mismatch in its ", kind_name(kind), " section)");
    at += n;
    read_section(kind, p, n, what, c);
    if (kind == Meta) seen_layout.meta = c.meta;
  }
  for (uint32_t k = Meta; k <= Buffers; ++k)
    HPC_REQUIRE(seen[k], what, " has no ", kind_name(k), " section");
  HPC_REQUIRE(at == bytes.size(), what, " has ", bytes.size() - at, " stray bytes after its end");
  return c;
}

}  // namespace hpc::ckpt

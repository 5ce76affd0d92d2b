#include "core/hash.hpp"

#include <cstdio>

namespace hpc {

uint64_t fnv1a(const void* data, size_t bytes, uint64_t so_far) {
  uint64_t h = so_far;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;  // FNV's 64-bit prime
  }
  return h;
}

std::string hex64(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string fnv1a_hex(const void* data, size_t bytes) { return hex64(fnv1a(data, bytes)); }

}  // namespace hpc

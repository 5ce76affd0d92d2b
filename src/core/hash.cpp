#include "core/hash.hpp"

#include <cstdio>

namespace hpc {

uint64_t fnv1a(const void* data, size_t bytes) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV's 64-bit offset basis
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;  // FNV's 64-bit prime
  }
  return h;
}

std::string fnv1a_hex(const void* data, size_t bytes) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(fnv1a(data, bytes)));
  return buf;
}

}  // namespace hpc

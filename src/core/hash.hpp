#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace hpc {

// The suite's one hash: 64-bit FNV-1a over bytes. Cheap, the same on every machine, and any
// changed bit changes it; not meant to resist someone crafting collisions. It compares the
// parameters of two runs (param_checksum), options and data across ranks, and model layouts,
// and names a GPU by its UUID.
uint64_t fnv1a(const void* data, size_t bytes);
// The same as 16 hex digits, for lines and files people read.
std::string fnv1a_hex(const void* data, size_t bytes);

}  // namespace hpc

#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace hpc {

// The suite's one hash: 64-bit FNV-1a over bytes. Cheap, the same on every machine, and any
// changed bit changes it; not meant to resist someone crafting collisions. It compares the
// parameters of two runs (param_checksum), options and data across ranks, and model layouts,
// and names a GPU by its UUID.
constexpr uint64_t kFnv1aBasis = 0xcbf29ce484222325ull;  // FNV's 64-bit offset basis
// so_far: the hash of the bytes before these, to hash several pieces as one (the basis: none).
uint64_t fnv1a(const void* data, size_t bytes, uint64_t so_far = kFnv1aBasis);
// 16 hex digits, for lines and files people read.
std::string hex64(uint64_t h);
std::string fnv1a_hex(const void* data, size_t bytes);

}  // namespace hpc

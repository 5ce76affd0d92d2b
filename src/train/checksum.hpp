#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace hpc::train {

// 64-bit FNV-1a over bytes, as 16 hex digits: cheap, stable across machines, and any
// changed bit changes it. Used to compare the parameters of two runs.
std::string fnv1a_hex(const void* data, size_t bytes);

}  // namespace hpc::train

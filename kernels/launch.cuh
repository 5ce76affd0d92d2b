// Launch geometry shared by the kernels: grid-stride loops over int64 element counts.
#pragma once

#include <algorithm>
#include <cstdint>

namespace hpc::kernels {

constexpr int kThreads = 256;

// Enough blocks to fill the GPU several times over; the grid-stride loop covers the rest.
inline unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::clamp<int64_t>(b, 1, 65535));
}

#define HPC_GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

}  // namespace hpc::kernels

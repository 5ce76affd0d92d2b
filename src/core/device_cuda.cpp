#include <cuda_runtime_api.h>

#include "core/device.hpp"

namespace hpc::device {

int cuda_device_count() {
  int n = 0;
  // No driver or no GPU is not an error here: the caller falls back to --device cpu only
  // when the user asked for auto, and reports it otherwise.
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later CUDA calls are not poisoned
    return 0;
  }
  return n;
}

bool built_with_cuda() { return true; }

std::string describe() {
  int rt = 0;
  cudaRuntimeGetVersion(&rt);
  return "CUDA runtime " + std::to_string(rt / 1000) + "." + std::to_string(rt % 1000 / 10) + ", " +
         std::to_string(cuda_device_count()) + " GPU(s) visible";
}

}  // namespace hpc::device

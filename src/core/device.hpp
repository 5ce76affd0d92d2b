// The device seam. CMake compiles device_cuda.cpp when the CUDA toolkit is present and
// device_none.cpp otherwise; nothing else in the code asks which one it got.
#pragma once

#include <string>

namespace hpc::device {

// Number of CUDA GPUs visible to this process (respects CUDA_VISIBLE_DEVICES); 0 without CUDA.
int cuda_device_count();
// True when this binary was built with the CUDA backend.
bool built_with_cuda();
// One line describing the GPU support, for --version and logs.
std::string describe();

}  // namespace hpc::device

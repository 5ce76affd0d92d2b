#include "core/device.hpp"

namespace hpc::device {
int cuda_device_count() { return 0; }
bool built_with_cuda() { return false; }
std::string describe() { return "CPU only (built without CUDA)"; }
}  // namespace hpc::device

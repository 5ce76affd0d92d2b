#include "core/device.hpp"

#include "core/error.hpp"

namespace hpc::device {
namespace {
[[noreturn]] void no_cuda() { usage_error("this hpctrain was built without CUDA: GPU memory is not available"); }
}  // namespace

int cuda_device_count() { return 0; }
bool built_with_cuda() { return false; }
std::string describe() { return "CPU only (built without CUDA)"; }
int select_gpu(int /*local_rank*/) { no_cuda(); }
uint64_t gpu_identity(int /*local_rank*/) { return 0; }
std::string gpu_name(int /*local_rank*/) { return ""; }
void* allocate(size_t /*bytes*/) { no_cuda(); }
void release(void* p) {
  HPC_CHECK(p == nullptr, "release of device memory in a build without CUDA");
}
void* allocate_pinned(size_t /*bytes*/) { return nullptr; }
void release_pinned(void* p) {
  HPC_CHECK(p == nullptr, "release of pinned memory in a build without CUDA");
}
void set_stream(CUstream_st* /*stream*/) {}
void zero(void* /*p*/, size_t /*bytes*/) { no_cuda(); }
void copy(void* /*dst*/, const void* /*src*/, size_t /*bytes*/, Copy /*direction*/) { no_cuda(); }
size_t memory_in_use() { return 0; }
size_t peak_memory_in_use() { return 0; }
void empty_cache() {}
}  // namespace hpc::device

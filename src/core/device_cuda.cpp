#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "core/caching_allocator.hpp"
#include "core/cuda_check.hpp"
#include "core/device.hpp"
#include "core/hash.hpp"
#include "core/log.hpp"

namespace hpc {
namespace detail {

void throw_gpu_error(const char* library, const char* call, const char* file, int line, const char* what) {
  // Out of memory is the user's to fix (batch size, model); the rest is ours or the machine's.
  const bool oom = std::string(what).find("out of memory") != std::string::npos;
  throw Error(oom ? ErrorKind::Usage : ErrorKind::Internal,
              concat(library, " error: ", what, " in ", call, " (", file, ":", line, ")",
                     oom ? "; try a smaller --batch-size" : ""));
}

}  // namespace detail

namespace device {
namespace {

std::atomic<int> selected_gpu{-1};  // select_gpu's choice, for threads that allocate pinned memory

// HPCTRAIN_NO_MEMORY_CACHING=1: each tensor its own cudaMalloc, of its own size (for
// compute-sanitizer, and the emulated kernels' test; caching_allocator.hpp).
bool no_memory_caching() {
  const char* v = std::getenv("HPCTRAIN_NO_MEMORY_CACHING");
  return v && std::string(v) == "1";
}

// One allocator for the process, as the CUDA context it sits on is one per process and
// device. Created on first use, after select_gpu.
CachingAllocator& allocator() {
  static CachingAllocator a({[](size_t n) -> void* {
                               void* p = nullptr;
                               const cudaError_t e = cudaMalloc(&p, n);
                               if (e == cudaErrorMemoryAllocation) {
                                 cudaGetLastError();  // out of memory is not sticky: clear it, let the cache retry
                                 return nullptr;
                               }
                               CUDA_CHECK(e);  // anything else (a fault of an earlier kernel) is no shortage
                               return p;
                             },
                             [](void* p) {
                               // Refused while a CUDA graph is captured (cudaFree synchronises
                               // the device): the block stays cached, the refusal not left as
                               // the next call's error.
                               if (cudaFree(p) == cudaSuccess) return true;
                               cudaGetLastError();
                               return false;
                             }},
                            !no_memory_caching());
  return a;
}

}  // namespace

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

int select_gpu(int local_rank) {
  const int n = cuda_device_count();
  HPC_REQUIRE(n > 0, "no CUDA GPU is visible (CUDA_VISIBLE_DEVICES, driver?); use --device cpu");
  const int gpu = local_rank % n;
  CUDA_CHECK(cudaSetDevice(gpu));
  selected_gpu = gpu;
  return gpu;
}

uint64_t gpu_identity(int local_rank) {
  const int n = cuda_device_count();
  if (n == 0) return 0;
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, local_rank % n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  const uint64_t h = fnv1a(p.uuid.bytes, sizeof p.uuid.bytes);
  return h == 0 ? 1 : h;
}

std::string gpu_name(int local_rank) {
  const int n = cuda_device_count();
  if (n == 0) return "";
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, local_rank % n) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  return p.name;
}

void* allocate(size_t bytes) { return allocator().allocate(bytes); }
void release(void* p) { allocator().release(p); }

void* allocate_pinned(size_t bytes) {
  if (cuda_device_count() == 0) return nullptr;
  const auto excluded = exclude_capture();  // (the loader's threads)
  // A thread starts on device 0 (the loader's does): without this, every rank would open a
  // context on GPU 0 just to allocate host memory.
  if (const int gpu = selected_gpu.load(); gpu >= 0) cudaSetDevice(gpu);
  void* p = nullptr;
  if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable) != cudaSuccess) {
    cudaGetLastError();  // clear it: the caller falls back to pageable memory
    return nullptr;
  }
  return p;
}

void release_pinned(void* p) {
  if (!p) return;
  const auto excluded = exclude_capture();  // cudaFreeHost synchronises the device
  cudaFreeHost(p);
}

namespace {
std::atomic<cudaStream_t> ordered_on{nullptr};  // set_stream's
}  // namespace

void set_stream(CUstream_st* stream) { ordered_on = stream; }

void zero(void* p, size_t bytes) {
  if (bytes) CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, ordered_on.load()));
}

void copy(void* dst, const void* src, size_t bytes, Copy direction) {
  if (!bytes) return;
  const cudaMemcpyKind kind = direction == Copy::HostToDevice   ? cudaMemcpyHostToDevice
                              : direction == Copy::DeviceToHost ? cudaMemcpyDeviceToHost
                                                                : cudaMemcpyDeviceToDevice;
  const cudaStream_t s = ordered_on.load();
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
}

size_t memory_in_use() { return allocator().stats().in_use; }
size_t peak_memory_in_use() { return allocator().stats().peak_in_use; }
void empty_cache() { allocator().empty_cache(); }

}  // namespace device
}  // namespace hpc

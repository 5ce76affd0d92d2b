// Memory of the GPU engine's and the JPEG decoder's own (not the caching allocator's, whose blocks
// are ordered on the compute stream alone) that only grows: get(bytes) gives a block of at least
// that many bytes, its contents lost when it grows; freed with its owner. Pinned (page-locked)
// host memory, whose copies to and from the GPU are asynchronous DMA, or device memory. A block
// that grows takes at least half as much again: requests that creep up (the decoder's batches of
// JPEGs of every size) free and allocate a few times, not at each new largest one. Each growth's
// free waits for the whole device, on whichever thread (the loader's, while a step runs; the
// decoder holds device::exclude_capture, so never while one is being captured).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>

#include "core/cuda_check.hpp"

namespace hpc::train {

template <cudaError_t (*Alloc)(void**, size_t), cudaError_t (*Free)(void*)>
class GrowingMemory {
 public:
  GrowingMemory() = default;
  ~GrowingMemory() {
    if (p_) Free(p_);
  }
  GrowingMemory(const GrowingMemory&) = delete;
  GrowingMemory& operator=(const GrowingMemory&) = delete;
  void* get(size_t bytes) {
    if (bytes > size_) {
      void* old = p_;
      const size_t last = size_;
      p_ = nullptr;
      size_ = 0;  // a failed allocation leaves none, not a smaller block counted as larger
      if (old) CUDA_CHECK(Free(old));
      const size_t grown = old ? std::max(bytes, last + last / 2) : bytes;
      CUDA_CHECK(Alloc(&p_, grown));
      size_ = grown;
    }
    return p_;
  }

 private:
  void* p_ = nullptr;
  size_t size_ = 0;
};

namespace cuda_memory {
inline cudaError_t allocate_pinned(void** p, size_t bytes) { return cudaHostAlloc(p, bytes, cudaHostAllocDefault); }
inline cudaError_t allocate_device(void** p, size_t bytes) { return cudaMalloc(p, bytes); }
}  // namespace cuda_memory

using PinnedBuffer = GrowingMemory<cuda_memory::allocate_pinned, cudaFreeHost>;
using DeviceBuffer = GrowingMemory<cuda_memory::allocate_device, cudaFree>;

}  // namespace hpc::train

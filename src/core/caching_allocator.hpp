// A caching allocator for device memory, after PyTorch's CUDA caching allocator (much
// reduced). cudaMalloc and cudaFree are slow and cudaFree synchronises the whole device, so
// a block that is released goes into a cache and the next request that fits takes it again;
// after the first step a training loop allocates nothing from the driver.
//
// The backend is two functions, so the caching logic is tested on the CPU (unit tests) and
// used over cudaMalloc/cudaFree on a GPU (core/device_cuda.cpp).
//
// Streams: a cached block may be handed out again at once. That is safe for memory used on
// one stream (the compute stream: kernels run in the order they were issued, so the next
// user's kernels run after the last user's, and device::zero of a new tensor is enqueued on it
// too: core/device.hpp). Memory used on another stream too (gradient
// buckets all-reduced on the communication stream) lives in the arenas, which are allocated
// once and never released while training.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <unordered_map>

namespace hpc {

class CachingAllocator {
 public:
  struct Backend {
    std::function<void*(size_t)> allocate;  // nullptr when the device is out of memory
    // false when the block could not be given back now (cudaFree refused while a CUDA graph
    // is being captured): it stays cached, to be given back later, never forgotten.
    std::function<bool(void*)> release;
  };
  struct Stats {
    size_t in_use = 0;        // bytes handed out (rounded sizes)
    size_t cached = 0;        // bytes released and kept for reuse
    size_t peak_in_use = 0;
    int64_t backend_allocations = 0;  // calls that reached the backend
    int64_t cache_hits = 0;
  };

  // caching = false: every request goes to the backend at its own size (not rounded) and every
  // release straight back (HPCTRAIN_NO_MEMORY_CACHING=1, as PyTorch's
  // PYTORCH_NO_CUDA_MEMORY_CACHING): slow, but each buffer ends where it was asked to, so an
  // access past it is seen by compute-sanitizer, or by the emulated kernels' guard pages.
  explicit CachingAllocator(Backend backend, bool caching = true);
  ~CachingAllocator();  // gives everything back to the backend
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least `bytes`. When the backend is out of memory the cache is given back
  // and the request tried once more; then a usage error says how much was asked and held
  // (the remedy is the user's: a smaller batch or model).
  void* allocate(size_t bytes);
  // Returns a block from allocate() to the cache. nullptr is ignored.
  void release(void* p);
  // Gives every cached block back to the backend (those it refuses stay cached).
  void empty_cache();
  Stats stats() const;

  // The size a request is served with: small requests in 512-byte steps, large ones (over
  // 1 MiB) in 2 MiB steps, so blocks of a step's varying shapes fit each other's requests.
  static size_t rounded(size_t bytes);

 private:
  void* take_cached(size_t size);
  void empty_cache_locked();

  Backend backend_;
  bool caching_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_;        // by size, for best fit
  std::unordered_map<void*, size_t> used_;   // block -> its rounded size
  Stats stats_;
};

}  // namespace hpc

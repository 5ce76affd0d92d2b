#include "core/caching_allocator.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace hpc {
namespace {

constexpr size_t kSmallStep = 512;
constexpr size_t kLargeThreshold = 1 << 20;
constexpr size_t kLargeStep = 2 << 20;

size_t round_up(size_t n, size_t step) { return (n + step - 1) / step * step; }

}  // namespace

CachingAllocator::CachingAllocator(Backend backend, bool caching) : backend_(std::move(backend)), caching_(caching) {
  HPC_CHECK(backend_.allocate && backend_.release, "a caching allocator needs both backend functions");
}

CachingAllocator::~CachingAllocator() {
  std::lock_guard lock(mu_);
  empty_cache_locked();
  for (auto& [p, size] : used_) backend_.release(p);  // tensors outliving the allocator: give back anyway
  used_.clear();
}

size_t CachingAllocator::rounded(size_t bytes) {
  if (bytes == 0) return kSmallStep;
  return bytes <= kLargeThreshold ? round_up(bytes, kSmallStep) : round_up(bytes, kLargeStep);
}

void* CachingAllocator::take_cached(size_t size) {
  // Best fit, but never a block more than twice the request: a small tensor must not pin a
  // large block that a later large request needs.
  auto it = free_.lower_bound(size);
  if (it == free_.end() || it->first > 2 * size) return nullptr;
  void* p = it->second;
  const size_t block = it->first;
  free_.erase(it);
  stats_.cached -= block;
  used_.emplace(p, block);
  stats_.in_use += block;
  ++stats_.cache_hits;
  return p;
}

void* CachingAllocator::allocate(size_t bytes) {
  const size_t size = caching_ ? rounded(bytes) : std::max<size_t>(bytes, 1);
  std::lock_guard lock(mu_);
  void* p = caching_ ? take_cached(size) : nullptr;
  if (!p) {
    p = backend_.allocate(size);
    if (!p && !free_.empty()) {  // out of memory: what the cache holds may be enough
      empty_cache_locked();
      p = backend_.allocate(size);
    }
    if (!p)
      usage_error("out of GPU memory allocating ", size >> 20, " MiB (", stats_.in_use >> 20, " MiB already in use",
                  stats_.cached ? detail::concat(", ", stats_.cached >> 20, " MiB cached that the driver would "
                                                 "not take back now") : std::string(),
                  "): try a smaller --batch-size or model");
    ++stats_.backend_allocations;
    used_.emplace(p, size);
    stats_.in_use += size;
  }
  stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.in_use);
  return p;
}

void CachingAllocator::release(void* p) {
  if (!p) return;
  std::lock_guard lock(mu_);
  auto it = used_.find(p);
  HPC_CHECK(it != used_.end(), "released a block this allocator did not hand out");
  stats_.in_use -= it->second;
  if (!caching_ && backend_.release(p)) {
    used_.erase(it);
    return;
  }
  free_.emplace(it->second, p);  // cached; without caching only when the backend refused it
  stats_.cached += it->second;
  used_.erase(it);
}

void CachingAllocator::empty_cache() {
  std::lock_guard lock(mu_);
  empty_cache_locked();
}

void CachingAllocator::empty_cache_locked() {
  for (auto it = free_.begin(); it != free_.end();) {
    if (backend_.release(it->second)) {
      stats_.cached -= it->first;
      it = free_.erase(it);
    } else {
      ++it;
    }
  }
}

CachingAllocator::Stats CachingAllocator::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace hpc

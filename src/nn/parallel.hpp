// Splitting a loop over rows among the OpenMP threads the math libraries also use
// (set_math_threads). The split is static, so results are reproducible for a given
// thread count.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace hpc::nn {

inline int math_threads() { return omp_get_max_threads(); }

// Calls fn(begin, end, part) for `parts` contiguous slices of [0, n); parts = threads used,
// at most max_parts (the size of the caller's per-part scratch), fewer for small n.
template <class F>
int parallel_rows(int64_t n, int64_t min_rows_per_part, int max_parts, F&& fn) {
  const int parts = static_cast<int>(
      std::clamp<int64_t>(n / std::max<int64_t>(min_rows_per_part, 1), 1, std::min(max_parts, math_threads())));
  if (parts == 1) {
    fn(int64_t{0}, n, 0);
    return 1;
  }
#pragma omp parallel num_threads(parts)
  {
    const int p = omp_get_thread_num();
    fn(n * p / parts, n * (p + 1) / parts, p);
  }
  return parts;
}

}  // namespace hpc::nn

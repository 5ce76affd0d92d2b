// Splitting a loop over rows among the OpenMP threads the math libraries also use
// (set_math_threads). The split is static, so results are reproducible for a given
// thread count; sums whose bits must not depend on it use fixed_parts or grouped_sum.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <vector>

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

// Sets this thread's math threads to one while it lives, so that a library call made meanwhile
// plans and runs on one thread.
class OneMathThread {
 public:
  OneMathThread() : threads_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~OneMathThread() { omp_set_num_threads(threads_); }
  OneMathThread(const OneMathThread&) = delete;
  OneMathThread& operator=(const OneMathThread&) = delete;

 private:
  int threads_;
};

// Calls fn(i) for i in [0, count), shared out among the math threads, each call on one thread
// alone: a library call inside it takes one thread (it does inside an active parallel region,
// and is given one where the calls run here, under OneMathThread). So work cut into items by
// its size alone gives the same bits on any thread count. An exception from fn is rethrown
// here once every item has run (none may leave a parallel region).
template <class F>
void each_on_one_thread(int64_t count, F&& fn) {
  const int threads = static_cast<int>(std::min<int64_t>(count, math_threads()));
  std::exception_ptr failed;
  auto call = [&](int64_t i) {
    try {
      fn(i);
    } catch (...) {
#pragma omp critical(hpctrain_each_on_one_thread)
      if (!failed) failed = std::current_exception();
    }
  };
  if (threads <= 1 || omp_in_parallel()) {
    const OneMathThread one;
    for (int64_t i = 0; i < count; ++i) call(i);
  } else {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t i = 0; i < count; ++i) call(i);
  }
  if (failed) std::rethrow_exception(failed);
}

// Calls fn(begin, end, part) for the `parts` contiguous slices of [0, n) that its size alone gives
// (at most max_parts, at least min_rows_per_part rows each), shared out among the threads: for
// sums per part that are then added in part order, with the same bits on any thread count.
template <class F>
int fixed_parts(int64_t n, int64_t min_rows_per_part, int max_parts, F&& fn) {
  const int parts = static_cast<int>(std::clamp<int64_t>(n / std::max<int64_t>(min_rows_per_part, 1), 1, max_parts));
  each_on_one_thread(parts, [&](int64_t p) { fn(n * p / parts, n * (p + 1) / parts, static_cast<int>(p)); });
  return parts;
}

// A sum of `items` work items (a weight gradient over blocks of pixels) with the same bits on
// any number of threads. The items fall into min(max_groups, items) groups of consecutive
// items, whatever the thread count; one thread adds a group's items in order into the group's
// own sum, and the groups' sums are then added in group order, so threads only share out
// whole groups. scratch becomes one work buffer of part_size floats per thread, then the
// groups' sums of sum_size floats each, all zero if `zeroed` (otherwise uninitialised: the
// first item of a group must write its sum, not add to it). add(item, first, work, sum) adds
// one item; first says whether it is its group's first. Returns the total, in scratch.
template <class Add>
float* grouped_sum(std::vector<float>& scratch, int64_t items, int64_t max_groups, int64_t part_size,
                   int64_t sum_size, bool zeroed, Add&& add) {
  const int64_t groups = std::min(max_groups, items);
  const int max_parts = static_cast<int>(std::min<int64_t>(groups, math_threads()));
  const auto size = static_cast<size_t>(max_parts * part_size + groups * sum_size);
  if (zeroed) scratch.assign(size, 0.0f);
  else scratch.resize(size);
  float* const sums = scratch.data() + max_parts * part_size;
  parallel_rows(groups, 1, max_parts, [&](int64_t g0, int64_t g1, int part) {
    float* work = scratch.data() + part * part_size;
    for (int64_t group = g0; group < g1; ++group) {
      const int64_t i0 = items * group / groups, i1 = items * (group + 1) / groups;
      for (int64_t i = i0; i < i1; ++i) add(i, i == i0, work, sums + group * sum_size);
    }
  });
  for (int64_t group = 1; group < groups; ++group) {
    const float* other = sums + group * sum_size;
    for (int64_t i = 0; i < sum_size; ++i) sums[i] += other[i];
  }
  return sums;
}

}  // namespace hpc::nn

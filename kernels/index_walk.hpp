// How our multi-range kernels find each element's place, written once for the GPU and the CPU
// tests (tests/unit/index_walk_test.cpp runs it as a grid of threads would, in CI, where there
// is no GPU): no CUDA header, so plain C++ includes it.
//  - convert_spans (elementwise.cu): spans of an arena, packed into lists of at most
//    kMaxConvertSpans (one launch each) and read as one run of elements.
//  - sgd_step (sgd.cu): the decay range of each element of a pack of four, from the range of the
//    pack's first element.
#pragma once

#include <cstdint>
#include <vector>

#if defined(__CUDACC__)
#define HPC_HOST_DEVICE __host__ __device__
#else
#define HPC_HOST_DEVICE
#endif

namespace hpc::kernels {

// count elements from offset, in two arenas of the same layout.
struct Span {
  int64_t offset = 0, count = 0;
};

constexpr int kMaxConvertSpans = 64;

// One launch's spans (passed by value: 1 KiB of kernel parameters), read as one run of `total`
// elements: element i of the run is span r's element i - end[r - 1], where end[r] counts the
// elements of spans 0 to r.
struct SpanList {
  int64_t offset[kMaxConvertSpans] = {}, end[kMaxConvertSpans] = {};
  int rows = 0;
  int64_t total = 0;
};

// The lists for spans, in their order, empty spans left out (none when all are empty).
// Returns false, naming nothing, for a span of negative offset or count: the caller says so.
inline bool pack_spans(const std::vector<Span>& spans, std::vector<SpanList>* lists) {
  lists->clear();
  for (const Span& s : spans) {
    if (s.offset < 0 || s.count < 0) return false;
    if (s.count == 0) continue;
    if (lists->empty() || lists->back().rows == kMaxConvertSpans) lists->emplace_back();
    SpanList& l = lists->back();
    l.total += s.count;
    l.offset[l.rows] = s.offset;
    l.end[l.rows] = l.total;
    ++l.rows;
  }
  return true;
}

// The arena index of run element i (0 <= i < total). r: the span of this thread's previous i
// (0 at first); a thread's i only grows, so r only moves forward.
HPC_HOST_DEVICE inline int64_t span_element(const SpanList& s, int& r, int64_t i) {
  while (i >= s.end[r]) ++r;
  return s.offset[r] + i - (r > 0 ? s.end[r - 1] : 0);
}

// The range holding element i: the first whose end is past i (the last range for any i beyond),
// a binary search of a table of a few hundred entries at most.
HPC_HOST_DEVICE inline int range_of(int64_t i, const int64_t* end, int ranges) {
  int lo = 0, hi = ranges - 1;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (end[mid] > i) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

// range_of(i) given r = range_of of an element before i: moved on past the ends i has reached
// (a pack of elements may straddle a range's end).
HPC_HOST_DEVICE inline int range_after(int r, int64_t i, const int64_t* end, int ranges) {
  while (r + 1 < ranges && i >= end[r]) ++r;
  return r;
}

}  // namespace hpc::kernels

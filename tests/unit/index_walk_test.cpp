// The element walks of our multi-range GPU kernels (kernels/index_walk.hpp), run on the CPU as a
// grid of threads runs them: CI has no GPU, and these are where an off-by-one would write the
// wrong gradient or decay the wrong parameter without any kernel test seeing it here.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/index_walk.hpp"

namespace hpc::kernels {
namespace {

// Spans of an arena as a backward pass defers them: random lengths (empty ones, single
// elements, adjacent ones), in reverse order of offset.
std::vector<Span> random_spans(size_t count, uint32_t seed, int64_t* arena) {
  std::mt19937 g(seed);
  std::vector<Span> spans;
  int64_t at = static_cast<int64_t>(g() % 5);
  for (size_t n = 0; n < count; ++n) {
    const int64_t length = n % 11 == 3 ? 0 : n % 11 == 5 ? 1 : static_cast<int64_t>(g() % 300);
    spans.push_back({at, length});
    at += length + (n % 4 == 0 ? 0 : static_cast<int64_t>(g() % 20));
  }
  *arena = at + 3;
  return {spans.rbegin(), spans.rend()};
}

TEST(IndexWalk, SpansPackIntoListsOfAtMost64InTheirOrderWithoutEmptyOnes) {
  int64_t arena = 0;
  const auto spans = random_spans(150, 1, &arena);
  std::vector<SpanList> lists;
  ASSERT_TRUE(pack_spans(spans, &lists));
  std::vector<Span> seen;
  for (const SpanList& l : lists) {
    ASSERT_GE(l.rows, 1);
    ASSERT_LE(l.rows, kMaxConvertSpans);
    for (int r = 0; r < l.rows; ++r) seen.push_back({l.offset[r], l.end[r] - (r > 0 ? l.end[r - 1] : 0)});
    EXPECT_EQ(l.total, l.end[l.rows - 1]);
  }
  std::vector<Span> want;
  for (const Span& s : spans)
    if (s.count > 0) want.push_back(s);
  ASSERT_EQ(seen.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(seen[i].offset, want[i].offset) << i;
    EXPECT_EQ(seen[i].count, want[i].count) << i;
  }
  EXPECT_GE(lists.size(), 2u) << "more than 64 non-empty spans take more than one launch";
  for (size_t i = 0; i + 1 < lists.size(); ++i) EXPECT_EQ(lists[i].rows, kMaxConvertSpans);

  ASSERT_TRUE(pack_spans({{5, 0}, {9, 0}}, &lists));
  EXPECT_TRUE(lists.empty()) << "nothing to launch";
  EXPECT_FALSE(pack_spans({{5, 3}, {-1, 2}}, &lists));
  EXPECT_FALSE(pack_spans({{5, -3}}, &lists));
}

// Every grid size, from one thread to more threads than elements: each element of each span is
// reached exactly once, at its own index, and nothing outside the spans is.
TEST(IndexWalk, AGridOfThreadsReachesEachSpansElementsOnceAndNothingElse) {
  int64_t arena = 0;
  const auto spans = random_spans(150, 2, &arena);
  std::vector<SpanList> lists;
  ASSERT_TRUE(pack_spans(spans, &lists));
  for (int64_t threads : {1, 7, 256, 768, 20000, 100000}) {
    SCOPED_TRACE(threads);
    std::vector<int> visits(static_cast<size_t>(arena), 0);
    for (const SpanList& l : lists) {
      // The run's element i, found by a linear scan: the reference.
      std::vector<int64_t> want(static_cast<size_t>(l.total));
      for (int r = 0, i = 0; r < l.rows; ++r)
        for (int64_t k = l.offset[r]; i < l.end[r]; ++k, ++i) want[static_cast<size_t>(i)] = k;
      for (int64_t t = 0; t < threads; ++t) {
        int r = 0;
        for (int64_t i = t; i < l.total; i += threads) {
          const int64_t k = span_element(l, r, i);
          ASSERT_EQ(k, want[static_cast<size_t>(i)]) << "run element " << i;
          ++visits[static_cast<size_t>(k)];
        }
      }
    }
    std::vector<int> expected(static_cast<size_t>(arena), 0);
    for (const Span& s : spans)
      for (int64_t k = s.offset; k < s.offset + s.count; ++k) ++expected[static_cast<size_t>(k)];
    EXPECT_EQ(visits, expected);
  }
}

// SGD's packs of four: the range each element gets by moving on from the pack's first element's
// equals its own binary search, for ends inside packs, ends at pack boundaries, ranges of one
// element, and elements past the last end (the last range).
TEST(IndexWalk, APacksElementsGetTheirOwnRanges) {
  const std::vector<int64_t> ends{1, 2, 3, 10, 12, 13, 501, 996, 997, 1000};
  const int ranges = static_cast<int>(ends.size());
  std::vector<int> got, want;
  for (int64_t first = 0; first < 1008; first += 4) {
    int r = range_of(first, ends.data(), ranges);
    for (int64_t j = 0; j < 4; ++j) {
      r = range_after(r, first + j, ends.data(), ranges);
      got.push_back(r);
      // The reference: the first range whose end is past the element, else the last.
      int w = ranges - 1;
      for (int q = 0; q < ranges; ++q)
        if (ends[static_cast<size_t>(q)] > first + j) {
          w = q;
          break;
        }
      want.push_back(w);
    }
  }
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace hpc::kernels

// The gradient bucketer against a stand-in communicator: how the arena is cut into buckets,
// when buckets are queued, the share weighting, and that finish() waits for every bucket.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <numeric>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "dist/bucketer.hpp"

namespace hpc::testing {
namespace {

// A world of `size` ranks whose other ranks hold the same values as this one: the sum is
// the value times size. Records each all-reduce's range and can hold it back a while.
class FakeComm final : public dist::Communicator {
 public:
  FakeComm(int size, const float* base) : size_(size), base_(base) {}
  int rank() const override { return 0; }
  int size() const override { return size_; }
  void allreduce_sum(float* data, int64_t n) override {
    std::this_thread::sleep_for(delay);
    for (int64_t i = 0; i < n; ++i) data[i] *= static_cast<float>(size_);
    {
      std::lock_guard lock(mu);
      calls.emplace_back(data - base_, data - base_ + n);
    }
    called.notify_all();
  }
  void allreduce_sum(double* data, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) data[i] *= size_;
  }
  void broadcast(void*, int64_t, int) override {}
  std::vector<uint64_t> allgather(uint64_t v) override { return std::vector<uint64_t>(size_, v); }
  void barrier() override {}
  std::unique_ptr<dist::Communicator> duplicate() override { return std::make_unique<FakeComm>(size_, base_); }
  [[noreturn]] void abort(int) override { std::abort(); }

  // Whether `n` float all-reduces have returned within `limit` (the bucketer's thread makes them).
  bool wait_for_calls(size_t n, std::chrono::seconds limit) {
    std::unique_lock lock(mu);
    return called.wait_for(lock, limit, [&] { return calls.size() >= n; });
  }
  size_t call_count() {
    std::lock_guard lock(mu);
    return calls.size();
  }

  std::chrono::milliseconds delay{0};
  std::mutex mu;
  std::condition_variable called;
  std::vector<std::pair<int64_t, int64_t>> calls;

 private:
  int size_;
  const float* base_;
};

constexpr int64_t kMB = 1 << 20;

// Every world size's even share (each rank a batch of global/ranks, as the trainer weights it)
// is known as one: its reduction is then NCCL's average, and its step one a CUDA graph holds.
// share * ranks == 1 in float, the former test, failed at 41, 47, 55, ... and 328 ranks (41
// hosts of 8 GPUs), whose steps all ran without graphs; an uneven share is never taken for one.
TEST(BatchShare, AnEvenShareIsKnownAtEveryWorldSize) {
  int missed_by_the_product = 0;
  for (int ranks = 1; ranks <= 4096; ++ranks) {
    for (const int64_t batch : {1, 32, 128, 250}) {
      const float share = dist::batch_share(batch, batch * ranks);
      ASSERT_TRUE(dist::even_share(share, ranks)) << ranks << " ranks of batch " << batch;
      if (share * static_cast<float>(ranks) != 1.0f) ++missed_by_the_product;
      if (ranks > 1) {
        ASSERT_FALSE(dist::even_share(dist::batch_share(batch - 1 + (batch == 1), batch * ranks + 1), ranks))
            << ranks << " ranks, a last batch's uneven share";
      }
    }
  }
  EXPECT_GT(missed_by_the_product, 0);  // (what the test is for)
}

TEST(GradientBucketer, BucketsAreRunsOfWholeGroupsFromTheEnd) {
  // Groups (layers) start at 0, 1000, 300000 (1.2 MB in), 310000; the arena ends at 600000.
  std::vector<float> g(600000, 1.0f);
  FakeComm comm(2, g.data());
  dist::GradientBucketer b(comm, g.data(), 600000, {0, 1000, 300000, 310000}, 2 * kMB, true);
  // First bucket: at least min(2 MB, 1 MB) = 262144 floats from the end: groups 310000..600000
  // (290000). Next: at least 2 MB = 524288 floats: the rest (everything down to 0).
  ASSERT_EQ(b.bucket_count(), 2u);
  b.begin_step(1.0f);
  b.ready_from(310000);  // the last group is done: the first bucket goes at once
  b.ready_from(1000);
  b.ready_from(0);
  EXPECT_GE(b.finish(), 0.0);
  ASSERT_EQ(comm.calls.size(), 2u);
  EXPECT_EQ(comm.calls[0], std::make_pair(int64_t{310000}, int64_t{600000}));
  EXPECT_EQ(comm.calls[1], std::make_pair(int64_t{0}, int64_t{310000}));
}

TEST(GradientBucketer, SharesWeightTheSumAndEveryElementIsReducedOnce) {
  std::vector<float> g(1000);
  std::iota(g.begin(), g.end(), 0.0f);
  FakeComm comm(4, g.data());
  dist::GradientBucketer b(comm, g.data(), 1000, {0, 100, 500, 900}, 1600, true);  // 400-float buckets
  for (int step = 0; step < 3; ++step) {
    std::iota(g.begin(), g.end(), 0.0f);
    b.begin_step(0.25f);  // a quarter of the global batch on each of 4 ranks: the mean
    for (int64_t at : {900, 500, 100, 0}) b.ready_from(at);
    b.finish();
    for (int i = 0; i < 1000; ++i) ASSERT_EQ(g[i], static_cast<float>(i)) << "step " << step << " element " << i;
  }
  const auto& t = b.last_timeline();
  ASSERT_EQ(t.buckets.size(), b.bucket_count());
  int64_t covered = 0;
  for (const auto& bk : t.buckets) covered += bk.end - bk.begin;
  EXPECT_EQ(covered, 1000);
}

// The timeline's zero is begin_step's moment (the trace, train/observe/trace.hpp, places the buckets by it).
TEST(GradientBucketer, TimelineStartsAtBeginStep) {
  std::vector<float> g(1000, 1.0f);
  FakeComm comm(2, g.data());
  dist::GradientBucketer b(comm, g.data(), 1000, {0, 500}, 1600, true);
  const auto before = std::chrono::steady_clock::now();
  b.begin_step(0.5f);
  const auto after = std::chrono::steady_clock::now();
  b.finish();
  EXPECT_LE(before, b.last_timeline().start);
  EXPECT_LE(b.last_timeline().start, after);
}

// With overlap, a bucket is all-reduced while the caller is still "computing"; without, not
// before finish(). The caller's "computing" lasts until the communication thread has reduced the
// first bucket (a fixed 50 ms was not always enough for that thread to be scheduled on a loaded
// machine); without overlap, 50 ms in which nothing may start.
TEST(GradientBucketer, OverlapStartsBeforeFinishAndNoOverlapDoesNot) {
  for (bool overlap : {true, false}) {
    SCOPED_TRACE(overlap ? "overlap" : "no overlap");
    std::vector<float> g(2 * kMB / 4, 1.0f);
    FakeComm comm(2, g.data());
    dist::GradientBucketer b(comm, g.data(), static_cast<int64_t>(g.size()), {0, static_cast<int64_t>(g.size()) / 2},
                             kMB / 2, overlap);
    ASSERT_EQ(b.bucket_count(), 2u);
    b.begin_step(0.5f);
    b.ready_from(static_cast<int64_t>(g.size()) / 2);
    // The rest of the backward pass.
    if (overlap) EXPECT_TRUE(comm.wait_for_calls(1, std::chrono::seconds(30))) << "no bucket reduced before finish()";
    else std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(comm.call_count(), overlap ? 1u : 0u) << "buckets reduced before finish()";
    b.ready_from(0);
    b.finish();
    const auto& t = b.last_timeline();
    if (overlap) EXPECT_LT(t.buckets[0].started, t.backward_done);
    else EXPECT_GE(t.buckets[0].queued, t.backward_done);
    for (float v : g) ASSERT_EQ(v, 1.0f);
  }
}

// finish() returns only when every bucket is reduced, and reports the wait.
TEST(GradientBucketer, FinishWaitsForSlowCommunication) {
  std::vector<float> g(1000, 3.0f);
  FakeComm comm(2, g.data());
  comm.delay = std::chrono::milliseconds(30);
  dist::GradientBucketer b(comm, g.data(), 1000, {0}, kMB, true);
  b.begin_step(0.5f);
  b.ready_from(0);
  const double waited = b.finish();
  EXPECT_GE(waited, 0.02);
  EXPECT_EQ(g[0], 3.0f);
  EXPECT_EQ(comm.calls.size(), 1u);
}

// average(): the batch-norm statistics (here the 10 floats after a 1000-float arena) are
// reduced once a step, scaled by 1 / ranks, ahead of the buckets still to come: at once with
// overlap, first thing in finish() without; finish() waits for them too.
TEST(GradientBucketer, TheStepsAverageGoesAheadOfTheBucketsAndFinishWaitsForIt) {
  for (bool overlap : {true, false}) {
    SCOPED_TRACE(overlap ? "overlap" : "no overlap");
    std::vector<float> g(1010, 2.0f);
    float* stats = g.data() + 1000;
    FakeComm comm(4, g.data());
    comm.delay = std::chrono::milliseconds(20);
    dist::GradientBucketer b(comm, g.data(), 1000, {0, 500}, 1600, overlap);  // 2 buckets of 500
    for (int step = 0; step < 2; ++step) {
      std::fill(stats, stats + 10, 3.0f);
      b.begin_step(0.25f);
      b.average(stats, 10);
      EXPECT_THROW(b.average(stats, 10), Error);  // once a step
      b.ready_from(500);
      b.ready_from(0);
      b.finish();
      ASSERT_EQ(comm.calls.size(), 3u * (step + 1));
      EXPECT_EQ(comm.calls[3 * step], std::make_pair(int64_t{1000}, int64_t{1010}));
      EXPECT_EQ(comm.calls[3 * step + 1], std::make_pair(int64_t{500}, int64_t{1000}));
      for (int i = 0; i < 10; ++i) ASSERT_EQ(stats[i], 3.0f) << "the mean of 4 ranks holding 3";
      for (int i = 0; i < 1000; ++i) ASSERT_EQ(g[i], 2.0f);
      EXPECT_EQ(b.last_timeline().buckets.size(), 2u);  // the average is not a bucket
    }
  }
}

// Device gradients (GPU training): no communication thread. Each bucket is handed to the
// device on the queuing thread as it is queued (the device enqueues its reduction behind the
// backward kernels), with the step's share; finish() joins once, and nothing waits on the host.
class RecordingDevice final : public dist::BucketDevice {
 public:
  void enqueue(float* x, int64_t n, float share) override {
    calls.push_back({x, n, share, std::this_thread::get_id()});
  }
  void join() override { ++joins; }
  struct Call {
    float* x;
    int64_t n;
    float share;
    std::thread::id thread;
  };
  std::vector<Call> calls;
  int joins = 0;
};

TEST(GradientBucketer, DeviceGradientsAreEnqueuedOnTheQueuingThreadAndJoinedOnce) {
  std::vector<float> g(600000, 1.0f);
  FakeComm comm(2, g.data());
  RecordingDevice dev;
  dist::GradientBucketer b(comm, g.data(), 600000, {0, 1000, 300000, 310000}, 2 * kMB, true, &dev);
  b.begin_step(0.5f);
  b.ready_from(310000);  // the first bucket
  EXPECT_EQ(dev.calls.size(), 1u);
  b.ready_from(300000);  // nothing new
  EXPECT_EQ(dev.calls.size(), 1u);
  EXPECT_EQ(dev.joins, 0);
  EXPECT_EQ(b.finish(), 0.0);  // the rest, then the join: no host wait
  EXPECT_EQ(dev.joins, 1);
  ASSERT_EQ(dev.calls.size(), 2u);
  EXPECT_EQ(dev.calls[0].x, g.data() + 310000);
  EXPECT_EQ(dev.calls[0].n, 290000);
  EXPECT_EQ(dev.calls[1].x, g.data());
  EXPECT_EQ(dev.calls[1].n, 310000);
  for (const auto& c : dev.calls) {
    EXPECT_EQ(c.share, 0.5f);
    EXPECT_EQ(c.thread, std::this_thread::get_id());
  }
  // The device reduces; the bucketer neither scaled nor called the communicator.
  EXPECT_EQ(g[0], 1.0f);
  EXPECT_TRUE(comm.calls.empty());
  // A second step: the same buckets again, after the step's average (1 / ranks, at once).
  b.begin_step(0.5f);
  float stats[3] = {1, 2, 3};
  b.average(stats, 3);
  ASSERT_EQ(dev.calls.size(), 3u);
  EXPECT_EQ(dev.calls[2].x, stats);
  EXPECT_EQ(dev.calls[2].n, 3);
  EXPECT_EQ(dev.calls[2].share, 0.5f);
  b.finish();
  EXPECT_EQ(dev.calls.size(), 5u);
  EXPECT_EQ(dev.joins, 2);
}

}  // namespace
}  // namespace hpc::testing

// GradientBucketer: all-reduces the gradient arena in buckets while the backward pass is
// still running (DESIGN.md principle 6; PyTorch DDP's buckets, Horovod's tensor fusion).
//
// Backward fills the arena from its end (the last layer's gradients first). The trainer
// reports each point from which every gradient to the end is final (ready_from); each
// bucket wholly inside that range is queued at once for the communication thread, which
// scales it by this rank's share of the global batch and sums it over the ranks (so the
// result is the global batch's mean gradient). finish() queues whatever is left and waits.
//
// Cross-thread contract: between begin_step() and finish() returning, the communication
// thread owns the queued buckets' memory; the main thread must not touch gradients it has
// reported ready, nor make MPI calls of its own (the library may only be SERIALIZED).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "dist/communicator.hpp"

namespace hpc::dist {

// When each bucket of one step was queued and all-reduced (seconds since begin_step, which
// the trainer calls before the forward pass), and
// when the trainer finished its backward pass and started waiting.
struct BucketTimeline {
  struct Bucket {
    int64_t begin = 0, end = 0;  // arena elements [begin, end)
    double queued = 0, started = 0, done = 0;
  };
  std::vector<Bucket> buckets;  // in the order they were all-reduced (arena end first)
  double backward_done = 0, finished = 0;
};

// Where the gradients live decides how a bucket is made ready for its sum. The default (host
// memory, CPU training) needs no fence and scales in place on the communication thread. GPU
// training supplies its own (train/gpu_engine.cpp): the fence is an event recorded on the
// compute stream after the backward kernels that produced the bucket, and prepare makes the
// communicator's stream wait for it and scales there, before the all-reduce on that stream.
class BucketDevice {
 public:
  virtual ~BucketDevice() = default;
  // Main thread, as buckets are queued: a token for "all work enqueued so far".
  virtual uint64_t fence() = 0;
  // Communication thread, before the bucket's all-reduce: wait for the fence, then x *= share.
  // When `reduce` is false no all-reduce follows (one rank): return only once x is final.
  virtual void prepare(float* x, int64_t n, float share, uint64_t fence, bool reduce) = 0;
};

class GradientBucketer {
 public:
  static constexpr int64_t kFirstBucketBytes = 1 << 20;  // 1 MB: see the constructor
  // grads: the gradient arena of n elements. group_starts: ascending arena offsets where a
  // group of gradients that backward completes together begins (one per layer with
  // parameters); buckets are runs of whole groups, from the arena's end, each at least
  // bucket_bytes (the first at least min(bucket_bytes, 1 MB); the one holding offset 0
  // takes what is left). overlap = false queues
  // nothing before finish() (to measure what overlap buys).
  // device: nullptr for host memory, else it must outlive the bucketer.
  GradientBucketer(Communicator& comm, float* grads, int64_t n, std::vector<int64_t> group_starts,
                   int64_t bucket_bytes, bool overlap, BucketDevice* device = nullptr);
  ~GradientBucketer();
  GradientBucketer(const GradientBucketer&) = delete;
  GradientBucketer& operator=(const GradientBucketer&) = delete;

  // A new step: this rank's gradients will be multiplied by `share` (its samples / the
  // global batch's) before the sum.
  void begin_step(float share);
  // Every gradient at arena offsets [offset, n) is final.
  void ready_from(int64_t offset);
  // Queues the rest, waits for every bucket; returns the seconds spent waiting (the
  // communication the backward pass did not hide).
  double finish();

  size_t bucket_count() const { return buckets_.size(); }
  const BucketTimeline& last_timeline() const { return timeline_; }

 private:
  void queue_upto(size_t count);  // queue buckets [next_, count)
  void run();                     // the communication thread
  double now() const;

  Communicator& comm_;
  BucketDevice* device_;
  float* grads_;
  int64_t n_;
  bool overlap_;
  std::vector<std::pair<int64_t, int64_t>> buckets_;  // [begin, end), arena end first
  size_t next_ = 0;                                   // buckets queued this step

  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<std::pair<size_t, uint64_t>> queue_;  // bucket, fence
  size_t done_ = 0;
  bool stop_ = false;
  float share_ = 1;
  std::exception_ptr failure_;
  int64_t step_start_ns_ = 0;
  BucketTimeline timeline_;
  std::thread thread_;
};

}  // namespace hpc::dist

// GradientBucketer: all-reduces the gradient arena in buckets while the backward pass is
// still running (DESIGN.md principle 6; PyTorch DDP's buckets, Horovod's tensor fusion).
//
// Backward fills the arena from its end (the last layer's gradients first). The trainer
// reports each point from which every gradient to the end is final (ready_from); each
// bucket wholly inside that range is queued at once for the communication thread, which
// scales it by this rank's share of the global batch and sums it over the ranks (so the
// result is the global batch's mean gradient). finish() queues whatever is left and waits.
//
// average() adds one more reduction to a step, ahead of the buckets still to come: the mean over
// the ranks of values the forward pass has made final (the batch-norm running statistics),
// hidden behind the backward pass as the buckets are.
//
// Cross-thread contract (host memory): between begin_step() and finish() returning, the
// communication thread owns the queued buckets' memory (and what average() was given); the main
// thread must not touch gradients it has reported ready, nor make MPI calls of its own (the
// library may only be SERIALIZED). With a BucketDevice there is no thread (see below).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "dist/communicator.hpp"

namespace hpc::dist {

// A rank's share of a step's global batch (its batch over the global batch), the weight of its
// gradients in their sum over the ranks.
inline float batch_share(int64_t batch, int64_t global_batch) {
  return static_cast<float>(static_cast<double>(batch) / static_cast<double>(global_batch));
}
// Every rank's share when all are alike: 1/ranks, in float (batch_share's for a batch of
// global/ranks, at every world size).
inline float even_share_of(int ranks) { return 1.0f / static_cast<float>(ranks); }
// Whether a share is every rank's alike: the sum of the shared-out parts is then the ranks'
// average, which NCCL takes as ncclAvg and a CUDA graph can hold (an uneven share needs an
// operator of its own made around each call). Not share * ranks == 1 in float, which fails at
// 41, 47, 55, ... and 328 ranks (41 hosts of 8 GPUs, what a lost host can leave), whose steps
// all ran without graphs.
inline bool even_share(float share, int ranks) { return share == even_share_of(ranks); }

// When each bucket of one step was queued and all-reduced (seconds since begin_step, which
// the trainer calls before the forward pass), and
// when the trainer finished its backward pass and started waiting.
struct BucketTimeline {
  struct Bucket {
    int64_t begin = 0, end = 0;  // arena elements [begin, end)
    double queued = 0, started = 0, done = 0;
  };
  std::vector<Bucket> buckets;  // in the order they were all-reduced (arena end first)
  // The step's average() (the batch-norm running statistics), when it had one: [0, values) of
  // what it was given; reduced on the same thread ahead of the buckets queued after it.
  Bucket statistics;
  bool averaged = false;
  std::chrono::steady_clock::time_point start;  // begin_step's: the zero of the times here
  double backward_done = 0, finished = 0;
};

// Where the gradients live decides how a bucket is reduced. Host memory (CPU training, no
// device): the communication thread scales each bucket and all-reduces it with MPI, and
// finish() waits for the thread. Device memory (GPU training: train/engine/gpu_engine.cpp): no thread;
// the main thread hands each bucket to the device as it is queued, and the device enqueues its
// reduction behind the backward kernels that produced it (an event on the compute stream that
// the communicator's stream waits for), as PyTorch DDP and llm.c do; finish() asks the device to
// make what follows (the optimizer) wait for every reduction, on the device, not on the host.
class BucketDevice {
 public:
  virtual ~BucketDevice() = default;
  // Main thread, as each bucket is queued: enqueue the sum over the ranks of x * share (every
  // gradient in x is final once the work enqueued so far on the compute stream is done).
  // Returns at once.
  virtual void enqueue(float* x, int64_t n, float share) = 0;
  // Main thread, in finish(): work enqueued on the compute stream from now on waits for every
  // reduction enqueued this step. Returns at once.
  virtual void join() = 0;
};

// The arena's buckets, [begin, end) in elements, arena end first: runs of whole groups (see
// GradientBucketer's constructor), shared by the host bucketer and the GPU's stream-ordered one.
std::vector<std::pair<int64_t, int64_t>> partition_buckets(int64_t n, std::vector<int64_t> group_starts,
                                                           int64_t bucket_bytes);

class GradientBucketer {
 public:
  static constexpr int64_t kFirstBucketBytes = 1 << 20;  // 1 MB: see the constructor
  // grads: the gradient arena of n elements. group_starts: ascending arena offsets where a
  // group of gradients that backward completes together begins (one per layer with
  // parameters); buckets are runs of whole groups, from the arena's end, each at least
  // bucket_bytes (the first at least min(bucket_bytes, 1 MB); the one holding offset 0
  // takes what is left). overlap = false queues
  // nothing before finish() (to measure what overlap buys).
  // device: nullptr for host memory, else it must outlive the bucketer (and comm is only
  // asked for its size).
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
  // This step also replaces x[0, n) with its mean over the ranks (at most once a step), reduced
  // before the buckets not yet queued (with overlap off: in finish(), before every bucket).
  // The caller leaves x alone until finish() returns.
  void average(float* x, int64_t n);
  // Queues the rest, waits for every bucket; returns the seconds spent waiting (the
  // communication the backward pass did not hide). With a BucketDevice: joins instead (the
  // device waits, not the host) and returns 0; the timeline then holds when each bucket was
  // enqueued (started = queued) and when finish() joined (done), host times both.
  double finish();

  size_t bucket_count() const { return buckets_.size(); }
  const BucketTimeline& last_timeline() const { return timeline_; }

 private:
  void queue_upto(size_t count);  // queue buckets [next_, count) (the average first, if pending)
  void queue_average();           // under mu_
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
  static constexpr size_t kAverage = static_cast<size_t>(-1);  // in queue_: the step's average
  std::deque<size_t> queue_;  // buckets (or kAverage) for the communication thread (host memory)
  float* average_x_ = nullptr;  // the step's average(): what, and whether it is still to queue
  int64_t average_n_ = 0;
  bool average_pending_ = false, averaged_ = false;
  float average_share() const { return even_share_of(comm_.size()); }  // each rank's part of it
  size_t expected_ = 0;  // reductions queued this step (buckets and the average)
  size_t done_ = 0;
  bool stop_ = false;
  float share_ = 1;
  std::exception_ptr failure_;
  int64_t step_start_ns_ = 0;
  BucketTimeline timeline_;
  std::thread thread_;
};

}  // namespace hpc::dist

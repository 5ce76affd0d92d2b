#include "dist/bucketer.hpp"

#include <algorithm>
#include <chrono>
#include <utility>

#include "core/error.hpp"

namespace hpc::dist {
namespace {
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

std::vector<std::pair<int64_t, int64_t>> partition_buckets(int64_t n, std::vector<int64_t> group_starts,
                                                           int64_t bucket_bytes) {
  HPC_CHECK(n > 0 && bucket_bytes > 0, "bucketer of ", n, " elements, ", bucket_bytes, " bytes per bucket");
  std::sort(group_starts.begin(), group_starts.end());
  group_starts.erase(std::unique(group_starts.begin(), group_starts.end()), group_starts.end());
  if (group_starts.empty() || group_starts.front() != 0) group_starts.insert(group_starts.begin(), 0);
  HPC_CHECK(group_starts.back() < n, "gradient group at ", group_starts.back(), " past the arena's end ", n);
  const int64_t per_bucket = std::max<int64_t>(1, bucket_bytes / static_cast<int64_t>(sizeof(float)));
  // The first bucket (the last layers, done first) is kept small, as PyTorch DDP does, so
  // communication starts early even when the whole model fits in one bucket.
  const int64_t first_bucket = std::min<int64_t>(
      per_bucket, GradientBucketer::kFirstBucketBytes / static_cast<int64_t>(sizeof(float)));
  std::vector<std::pair<int64_t, int64_t>> buckets;
  int64_t end = n;
  for (size_t g = group_starts.size(); g-- > 0;) {
    const int64_t begin = group_starts[g];
    if (end - begin >= (buckets.empty() ? first_bucket : per_bucket) || begin == 0) {
      buckets.emplace_back(begin, end);
      end = begin;
    }
  }
  return buckets;
}

GradientBucketer::GradientBucketer(Communicator& comm, float* grads, int64_t n, std::vector<int64_t> group_starts,
                                   int64_t bucket_bytes, bool overlap, BucketDevice* device)
    : comm_(comm),
      device_(device),
      grads_(grads),
      n_(n),
      overlap_(overlap),
      buckets_(partition_buckets(n, std::move(group_starts), bucket_bytes)) {
  if (!device_) thread_ = std::thread([this] { run(); });
}

GradientBucketer::~GradientBucketer() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

double GradientBucketer::now() const { return static_cast<double>(now_ns() - step_start_ns_) * 1e-9; }

void GradientBucketer::begin_step(float share) {
  std::lock_guard lock(mu_);
  HPC_CHECK(queue_.empty() && done_ == expected_, "begin_step while buckets of the last step are in flight");
  step_start_ns_ = now_ns();
  share_ = share;
  next_ = 0;
  expected_ = 0;
  done_ = 0;
  average_pending_ = averaged_ = false;
  timeline_ = BucketTimeline{};
  timeline_.buckets.resize(buckets_.size());
  timeline_.start = std::chrono::steady_clock::time_point(std::chrono::nanoseconds(step_start_ns_));
}

void GradientBucketer::ready_from(int64_t offset) {
  if (!overlap_) return;
  size_t count = next_;
  while (count < buckets_.size() && buckets_[count].first >= offset) ++count;
  if (count > next_) queue_upto(count);
}

void GradientBucketer::average(float* x, int64_t n) {
  {
    std::lock_guard lock(mu_);
    HPC_CHECK(!averaged_ && n >= 0, "a second average in one step, or one of ", n, " values");
    average_x_ = x, average_n_ = n;
    averaged_ = average_pending_ = true;
    if (overlap_) queue_average();
  }
  if (!device_) work_cv_.notify_one();
}

void GradientBucketer::queue_average() {
  if (!std::exchange(average_pending_, false)) return;
  ++expected_;
  timeline_.averaged = true;
  timeline_.statistics.end = average_n_;
  timeline_.statistics.queued = now();
  if (device_) {
    device_->enqueue(average_x_, average_n_, average_share());
    timeline_.statistics.started = timeline_.statistics.queued;
    ++done_;
  } else {
    queue_.push_back(kAverage);
  }
}

void GradientBucketer::queue_upto(size_t count) {
  {
    std::lock_guard lock(mu_);
    queue_average();  // no overlap: held until finish(), and then ahead of every bucket
    const double t = now();
    for (size_t b = next_; b < count; ++b) {
      timeline_.buckets[b].begin = buckets_[b].first;
      timeline_.buckets[b].end = buckets_[b].second;
      timeline_.buckets[b].queued = t;
      ++expected_;
      if (device_) {
        device_->enqueue(grads_ + buckets_[b].first, buckets_[b].second - buckets_[b].first, share_);
        timeline_.buckets[b].started = t;
        ++done_;
      } else {
        queue_.push_back(b);
      }
    }
    next_ = count;
  }
  if (!device_) work_cv_.notify_one();
}

double GradientBucketer::finish() {
  const int64_t wait_start = now_ns();
  timeline_.backward_done = now();
  queue_upto(buckets_.size());
  if (device_) {
    device_->join();
    timeline_.finished = now();
    for (auto& b : timeline_.buckets) b.done = timeline_.finished;
    if (timeline_.averaged) timeline_.statistics.done = timeline_.finished;
    return 0;
  }
  std::unique_lock lock(mu_);
  done_cv_.wait(lock, [&] { return done_ == expected_ || failure_; });
  timeline_.finished = now();
  if (failure_) std::rethrow_exception(failure_);
  return static_cast<double>(now_ns() - wait_start) * 1e-9;
}

void GradientBucketer::run() {
  for (;;) {
    size_t b;
    float share;
    {
      std::unique_lock lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      b = queue_.front();
      queue_.pop_front();
      share = b == kAverage ? average_share() : share_;
      (b == kAverage ? timeline_.statistics : timeline_.buckets[b]).started = now();
    }
    try {
      float* p = b == kAverage ? average_x_ : grads_ + buckets_[b].first;
      const int64_t len = b == kAverage ? average_n_ : buckets_[b].second - buckets_[b].first;
      if (share != 1.0f)
        for (int64_t i = 0; i < len; ++i) p[i] *= share;
      if (comm_.size() > 1) comm_.allreduce_sum(p, len);
    } catch (...) {
      std::lock_guard lock(mu_);
      failure_ = std::current_exception();
      done_cv_.notify_all();
      return;
    }
    {
      std::lock_guard lock(mu_);
      (b == kAverage ? timeline_.statistics : timeline_.buckets[b]).done = now();
      ++done_;
    }
    done_cv_.notify_all();
  }
}

}  // namespace hpc::dist

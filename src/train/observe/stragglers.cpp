#include "train/observe/stragglers.hpp"

#include <algorithm>
#include <cstdio>

#include "core/error.hpp"
#include "dist/communicator.hpp"

namespace hpc::train {
namespace {

// Long enough to smooth one slow step (a checkpoint's write, a page fault) away, short enough to
// name a host that turned slow within seconds; the step cap bounds rank 0's memory for steps of
// milliseconds (2 x world figures each).
constexpr double kWindowSeconds = 10;
constexpr size_t kWindowMaxSteps = 500;

}  // namespace

StragglerWindow::StragglerWindow(int world, double seconds, size_t max_steps)
    : world_(world), seconds_(seconds), max_steps_(std::max<size_t>(max_steps, 1)), sums_(2 * static_cast<size_t>(world), 0.0) {}

void StragglerWindow::add(double at, std::span<const double> slots) {
  HPC_CHECK(slots.size() == sums_.size(), "straggler window of ", world_, " ranks given ", slots.size(), " figures");
  steps_.push_back({at, std::vector<double>(slots.begin(), slots.begin() + static_cast<ptrdiff_t>(sums_.size()))});
  for (size_t i = 0; i < sums_.size(); ++i) sums_[i] += steps_.back().slots[i];
  // The newest step always stays: a step longer than the window is the window.
  while (steps_.size() > 1 && (steps_.size() > max_steps_ || steps_.front().at < at - seconds_)) {
    for (size_t i = 0; i < sums_.size(); ++i) sums_[i] -= steps_.front().slots[i];
    steps_.pop_front();
  }
}

std::optional<Straggler> StragglerWindow::slowest() const {
  if (steps_.empty()) return std::nullopt;
  std::vector<double> busy(static_cast<size_t>(world_));
  for (size_t r = 0; r < busy.size(); ++r) busy[r] = std::max(0.0, sums_[2 * r]);  // not below 0 by rounding
  const auto slow = static_cast<size_t>(std::max_element(busy.begin(), busy.end()) - busy.begin());
  std::vector<double> sorted = busy;
  const auto middle = sorted.begin() + (world_ - 1) / 2;
  std::nth_element(sorted.begin(), middle, sorted.end());
  const double n = static_cast<double>(steps_.size());
  Straggler s;
  s.rank = static_cast<int>(slow);
  s.busy_seconds = busy[slow] / n;
  s.wait_seconds = std::max(0.0, sums_[2 * slow + 1]) / n;
  s.median_busy_seconds = *middle / n;
  // A median of nothing (steps too short for the clock) makes no straggler.
  s.ratio = *middle > 0 ? busy[slow] / *middle : 1.0;
  return s;
}

std::vector<std::string> host_of_each_rank(dist::ProcessContext& ctx) {
  if (ctx.world_size() == 1) return {ctx.host()};
  return dist::allgather_strings(ctx.world(), ctx.host());
}

StragglerTracker::StragglerTracker(int rank, std::vector<std::string> hosts)
    : rank_(rank), world_(static_cast<int>(hosts.size())), hosts_(std::move(hosts)),
      slots_(2 * hosts_.size(), 0.0) {
  if (rank_ == 0 && world_ > 1) window_.emplace(world_, kWindowSeconds, kWindowMaxSteps);
}

std::span<double> StragglerTracker::slots() {
  std::fill(slots_.begin(), slots_.end(), 0.0);
  const double step = std::chrono::duration<double>(Clock::now() - asked_).count();
  slots_[2 * static_cast<size_t>(rank_)] = std::max(0.0, step - comm_wait_);
  slots_[2 * static_cast<size_t>(rank_) + 1] = comm_wait_ + agreement_;
  return slots_;
}

void StragglerTracker::agreed(double agreement_seconds, double at) {
  if (window_) window_->add(at, slots_);
  comm_wait_ = 0;
  agreement_ = agreement_seconds;
}

std::optional<Straggler> StragglerTracker::slowest() const {
  return window_ ? window_->slowest() : std::nullopt;
}

std::string StragglerTracker::heartbeat_lines() const {
  const std::optional<Straggler> s = slowest();
  if (!s) return "";
  char ratio[32];
  std::snprintf(ratio, sizeof ratio, "%.3f", s->ratio);
  return "slowest_rank=" + std::to_string(s->rank) + "\nslowest_host=" + host(s->rank) + "\nstraggler_ratio=" + ratio +
         "\n";
}

}  // namespace hpc::train

// Slow ranks: each rank's step time split into its busy time (its own work: the wait for its
// batch, forward, backward, the update) and its time waiting for the others (the gradient
// buckets' wait after the backward pass, and the step boundary's all-reduce). A data-parallel
// job runs at the pace of its slowest rank: that rank is the one busy longest, while the others
// wait for it. Gathered without a collective of its own: each rank fills its two slots of
// 2 x world figures that ride along in the boundary's all-reduce (StepAgreement::reach), whose sum
// gives rank 0 every rank's figures. Rank 0 keeps the last few seconds of them and names the
// slowest rank, its host and its busy time over the median rank's: the step events, Prometheus
// and the heartbeat, which hpcrun reads to report and drain a persistent straggler.
//
// On the GPU the engine's gradient wait is the device's (the host is not held: comm_wait is 0),
// and the host waits for the whole step at its end: busy time there is the whole step but the
// boundary's all-reduce, so a rank slow on the host (its data, its CPU) stands out, while a slow
// device makes every rank's step as long as its own.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dist/process.hpp"

namespace hpc::train {

// The slowest rank over a window of steps.
struct Straggler {
  int rank = 0;
  double busy_seconds = 0;         // its busy time per step
  double wait_seconds = 0;         // its time waiting for the others per step
  double median_busy_seconds = 0;  // the median rank's busy time per step
  double ratio = 1;                // busy_seconds over median_busy_seconds
};

// Every rank's figures of the steps of the last `seconds` (at most `max_steps` steps): pure, so
// that the tests can give it any figures.
class StragglerWindow {
 public:
  StragglerWindow(int world, double seconds, size_t max_steps);
  // One step's figures, at `at` seconds (non-decreasing): `slots` holds each rank's busy and
  // waiting seconds, rank r's at 2r and 2r + 1.
  void add(double at, std::span<const double> slots);
  // The rank busy longest over the window (the lowest such rank on a tie); its ratio is to the
  // median rank's busy time (the lower median: with 2 ranks the faster one). None before the
  // first step.
  std::optional<Straggler> slowest() const;
  size_t steps() const { return steps_.size(); }

 private:
  struct Step {
    double at;
    std::vector<double> slots;
  };
  const int world_;
  const double seconds_;
  const size_t max_steps_;
  std::deque<Step> steps_;
  std::vector<double> sums_;  // of the window's slots
};

// Each rank's host name, by rank (collective, once at set-up: one all-gather of the names' hashes,
// then one broadcast per host).
std::vector<std::string> host_of_each_rank(dist::ProcessContext& ctx);

// One rank's part: it times its own steps, and (rank 0) keeps the window.
class StragglerTracker {
 public:
  using Clock = std::chrono::steady_clock;
  // hosts: each rank's (host_of_each_rank).
  StragglerTracker(int rank, std::vector<std::string> hosts);
  // The step loop asked for the step's batch at `asked`.
  void step_began(Clock::time_point asked) { asked_ = asked; }
  // The engine's wait for the gradient buckets after the backward pass.
  void waited(double seconds) { comm_wait_ += seconds; }
  // Right before the boundary's all-reduce: this rank's figures of the step in its slots, zeros
  // elsewhere; the all-reduce sums them in place.
  std::span<double> slots();
  // Right after it: `agreement_seconds` it took (waiting, counted in the next step's figures);
  // `at`: seconds since the run began. On rank 0 the window takes every rank's figures.
  void agreed(double agreement_seconds, double at);
  // Rank 0's verdict over the window (none on the other ranks, on one rank, or before a step).
  std::optional<Straggler> slowest() const;
  const std::string& host(int rank) const { return hosts_[static_cast<size_t>(rank)]; }
  const std::vector<std::string>& hosts() const { return hosts_; }
  // "slowest_rank=R\nslowest_host=H\nstraggler_ratio=X\n" for the heartbeat ("" without a verdict).
  std::string heartbeat_lines() const;

 private:
  const int rank_, world_;
  const std::vector<std::string> hosts_;
  std::vector<double> slots_;
  Clock::time_point asked_ = Clock::now();
  double comm_wait_ = 0;  // this step's, inside its time since asked_
  double agreement_ = 0;  // the last boundary's all-reduce, before asked_
  std::optional<StragglerWindow> window_;  // rank 0's, with several ranks
};

}  // namespace hpc::train

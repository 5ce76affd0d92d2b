// Figures of single steps, for dashboards: rank 0's step events in the metrics file every
// --metrics-every-steps N steps, and its Prometheus textfile (--prometheus-file), rewritten at
// most about once a second, after each epoch and at the end: the last step's figures as gauges,
// counters of the steps, samples and checkpoints this process did (_total), the time of the last
// checkpoint and the throughput over the last minute. Both report the same figures of
// the same steps; neither adds a collective to the step (the loss is rank 0's own).
#pragma once

#include <chrono>
#include <deque>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/store.hpp"
#include "train/observe/metrics.hpp"
#include "train/observe/prometheus.hpp"
#include "train/observe/stragglers.hpp"
#include "train/options/options.hpp"

namespace hpc::train {

struct StepFigures {
  int64_t step = 0;               // global steps done, this one included
  int64_t epoch = 0;              // the epoch the step belongs to, from 1
  double loss = 0;                // rank 0's part of the global batch
  double learning_rate = 0;       // the schedule's, as the step used it
  double images_per_second = 0;   // the global batch over step_seconds
  double data_wait_seconds = 0;   // the step loop's wait for the loader's batch
  double comm_wait_seconds = 0;   // the wait for the gradient all-reduce after the backward pass
  double step_seconds = 0;        // from asking for the batch to the end of the update
  double elapsed_seconds = 0;     // since the process started, as the epoch lines' (hpctrain-plot's time)
  int64_t samples = 0;            // the step's global batch (not in the step event)
  // The slowest rank over the last seconds of steps, up to the one before this (stragglers.hpp;
  // none on one rank), and its host.
  std::optional<Straggler> slowest = std::nullopt;
  std::string slowest_host = {};
};

// The metrics file's step event.
JsonObject step_event(const StepFigures& f);

enum class RunState { Training, Stopped, Done, Failed };

// The Prometheus file's `hpctrain_job` label: SLURM_JOB_ID, else the checkpoint directory's
// name, else "hpctrain".
std::string prometheus_job(const TrainOptions& o);

// Rank 0's: made once the run can train (it writes the Prometheus file at once, state
// "training"); a run that ends without ended() (an error) leaves the state "failed".
class StepMetrics {
 public:
  // metrics: rank 0's metrics file (or none); start: the step the run starts after; checkpoints:
  // rank 0's checkpoint writer (none without --checkpoint-dir), whose writes it counts.
  StepMetrics(const TrainOptions& o, int world_size, int64_t planned_steps, int64_t start_step,
              MetricsWriter& metrics, ckpt::AsyncWriter* checkpoints = nullptr);
  ~StepMetrics();
  StepMetrics(const StepMetrics&) = delete;
  StepMetrics& operator=(const StepMetrics&) = delete;
  void after_step(const StepFigures& f);
  void after_epoch(double test_accuracy);
  // exit_code: the process's, where it is known (a stop's): the hpctrain_exit_code gauge.
  void ended(RunState state, std::optional<int> exit_code = std::nullopt);

 private:
  void publish(bool now);
  std::vector<Gauge> gauges() const;
  void prepare_stopped_file(std::vector<Gauge> g) const;

  const int64_t every_, planned_, start_step_;
  MetricsWriter& metrics_;
  ckpt::AsyncWriter* checkpoints_;
  int64_t samples_ = 0;  // this process's, for hpctrain_samples_total
  // (seconds since the start, samples so far) of the steps of the last kThroughputWindow seconds
  std::deque<std::pair<double, int64_t>> window_;
  std::optional<PrometheusTextfile> prometheus_;
  StepFigures last_;
  bool stepped_ = false;  // whether last_ holds a step's figures
  std::optional<double> test_accuracy_;
  RunState state_ = RunState::Training;
  std::optional<int> exit_code_;
  std::chrono::steady_clock::time_point written_;  // of the Prometheus file, last
};

}  // namespace hpc::train

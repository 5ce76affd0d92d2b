#include "train/observe/step_metrics.hpp"

#include <cstdlib>
#include <filesystem>
#include <vector>

#include "train/stop/final_records.hpp"

namespace hpc::train {
namespace {

using SteadyClock = std::chrono::steady_clock;

// At most about one rewrite a second: a scrape every 15 s or more sees fresh figures, and a
// step of milliseconds pays nothing for them.
constexpr double kPrometheusInterval = 1.0;
constexpr double kThroughputWindow = 60;  // seconds of hpctrain_images_per_second_1m

const char* state_name(RunState s) {
  switch (s) {
    case RunState::Training: return "training";
    case RunState::Stopped: return "stopped";
    case RunState::Done: return "done";
    case RunState::Failed: return "failed";
  }
  return "failed";
}

double unix_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The step's figures as gauges, in the step event's order.
void add_step_gauges(std::vector<Gauge>& g, const StepFigures& f) {
  g.push_back({"epoch", "Epoch of the last step (from 1).", static_cast<double>(f.epoch)});
  g.push_back({"loss", "Training loss of the last step (rank 0's part of the global batch).", f.loss});
  g.push_back({"learning_rate", "Learning rate of the last step, as the schedule gave it.", f.learning_rate});
  g.push_back({"images_per_second", "Samples per second of the last step, all ranks together.",
               f.images_per_second});
  g.push_back({"data_wait_seconds", "Time the last step waited for its batch from the data loader.",
               f.data_wait_seconds});
  g.push_back({"comm_wait_seconds", "Time the last step waited for the gradient all-reduce after its backward pass.",
               f.comm_wait_seconds});
  g.push_back({"step_seconds", "Wall-clock time of the last step, from asking for its batch to its update.",
               f.step_seconds});
  if (!f.slowest) return;
  const std::vector<std::pair<std::string, std::string>> host = {{"host", f.slowest_host}};
  g.push_back({"slowest_rank", "The rank whose own work per step (busy time) was longest over the last 10 s.",
               static_cast<double>(f.slowest->rank), host});
  g.push_back({"straggler_ratio", "The slowest rank's busy time per step over the median rank's (1: none slower).",
               f.slowest->ratio, host});
}

Gauge exit_code_gauge(int code) {
  return {"exit_code", "The process's exit code, once the run stopped (as its heartbeat's and its \"stopped\" event's).",
          static_cast<double>(code)};
}

}  // namespace

JsonObject step_event(const StepFigures& f) {
  JsonObject e{{"event", std::string("step")},
          {"step", f.step},
          {"epoch", f.epoch},
          {"loss", f.loss},
          {"learning_rate", f.learning_rate},
          {"images_per_second", f.images_per_second},
          {"data_wait_seconds", f.data_wait_seconds},
          {"comm_wait_seconds", f.comm_wait_seconds},
          {"step_seconds", f.step_seconds},
          {"elapsed_seconds", f.elapsed_seconds}};
  if (f.slowest) {
    e["slowest_rank"] = static_cast<int64_t>(f.slowest->rank);
    e["slowest_host"] = f.slowest_host;
    e["straggler_ratio"] = f.slowest->ratio;
    e["slowest_busy_seconds"] = f.slowest->busy_seconds;
    e["slowest_wait_seconds"] = f.slowest->wait_seconds;
    e["median_busy_seconds"] = f.slowest->median_busy_seconds;
  }
  return e;
}

std::string prometheus_job(const TrainOptions& o) {
  const char* slurm = std::getenv("SLURM_JOB_ID");
  if (slurm && *slurm) return slurm;
  if (!o.checkpoint_dir.empty()) {
    // "runs/a/" names "a", as "runs/a" does.
    const std::filesystem::path dir = std::filesystem::absolute(o.checkpoint_dir).lexically_normal();
    const std::string name = (dir.has_filename() ? dir : dir.parent_path()).filename().string();
    if (!name.empty()) return name;
  }
  return "hpctrain";
}

StepMetrics::StepMetrics(const TrainOptions& o, int world_size, int64_t planned_steps, int64_t start_step,
                         MetricsWriter& metrics, ckpt::AsyncWriter* checkpoints)
    : every_(o.metrics_every_steps), planned_(planned_steps), start_step_(start_step), metrics_(metrics),
      checkpoints_(checkpoints) {
  last_.step = start_step;
  final_records::steps_done(start_step);
  final_records::arm();  // a stop at once from here on says so in the metrics and Prometheus files
  if (o.prometheus_file.empty()) return;
  prometheus_.emplace(o.prometheus_file, std::vector<std::pair<std::string, std::string>>{
                                             {"hpctrain_job", prometheus_job(o)},
                                             {"world_size", std::to_string(world_size)}});
  publish(true);
}

StepMetrics::~StepMetrics() {
  if (state_ == RunState::Training) ended(RunState::Failed);
}

void StepMetrics::after_step(const StepFigures& f) {
  last_ = f;
  stepped_ = true;
  samples_ += f.samples;
  final_records::steps_done(f.step);
  window_.emplace_back(f.elapsed_seconds, samples_);
  // The oldest step kept is the one just before the window: the samples after it fell inside.
  while (window_.size() > 2 && window_[1].first <= f.elapsed_seconds - kThroughputWindow) window_.pop_front();
  if (every_ > 0 && f.step % every_ == 0) metrics_.write(step_event(f));
  publish(false);
}

void StepMetrics::after_epoch(double test_accuracy) {
  test_accuracy_ = test_accuracy;
  publish(true);
}

void StepMetrics::ended(RunState state, std::optional<int> exit_code) {
  final_records::disarm();  // this is the run's own last word
  state_ = state;
  exit_code_ = exit_code;
  publish(true);
}

void StepMetrics::publish(bool now) {
  if (!prometheus_ || (!now && std::chrono::duration<double>(SteadyClock::now() - written_).count() <
                                   kPrometheusInterval))
    return;
  const final_records::Writing writing;
  if (final_records::Writing::closed()) return;  // the process ends at once: "stopped" is written instead
  std::vector<Gauge> g = gauges();
  if (state_ == RunState::Training) prepare_stopped_file(g);
  g.push_back({"last_update_timestamp_seconds", "Unix time of this file's last update.", unix_time()});
  prometheus_->write(g, state_ != RunState::Training);  // a last state: also on a full disk
  written_ = SteadyClock::now();
}

// The file as a stop at once leaves it (final_records.hpp): these figures, state "stopped", and
// the exit code and the time filled in then.
void StepMetrics::prepare_stopped_file(std::vector<Gauge> g) const {
  for (Gauge& gauge : g)
    if (gauge.name == "state") gauge.value = gauge.labels.at(0).second == state_name(RunState::Stopped) ? 1.0 : 0.0;
  const auto up_to_value = [this](Gauge gauge) {
    const std::string text = prometheus_->render({gauge});
    return text.substr(0, text.size() - 2);  // "... 0\n" without "0\n"
  };
  final_records::prometheus_file(prometheus_->written_path(), prometheus_->render(g), up_to_value(exit_code_gauge(0)),
                                 up_to_value({"last_update_timestamp_seconds", "Unix time of this file's last update.", 0}));
}

std::vector<Gauge> StepMetrics::gauges() const {
  std::vector<Gauge> g;
  g.push_back({"step", "Global training steps done.", static_cast<double>(last_.step)});
  g.push_back({"planned_steps", "Global steps the run is planned to have in all.", static_cast<double>(planned_)});
  if (stepped_) add_step_gauges(g, last_);
  if (test_accuracy_) g.push_back({"test_accuracy", "Test accuracy after the last epoch (0 to 1).", *test_accuracy_});
  for (RunState s : {RunState::Training, RunState::Stopped, RunState::Done, RunState::Failed})
    g.push_back({"state", "The run's state: 1 for the one it is in (training, stopped, done or failed).",
                 s == state_ ? 1.0 : 0.0, {{"state", state_name(s)}}});
  g.push_back({"steps_total", "Global training steps this process has done (from its start or resume).",
               static_cast<double>(last_.step - start_step_), {}, true});
  g.push_back({"samples_total", "Samples of all ranks this process's steps have trained on.",
               static_cast<double>(samples_), {}, true});
  const auto [written, written_at] = checkpoints_ ? checkpoints_->completed() : std::pair<int64_t, double>{0, 0};
  g.push_back({"checkpoints_total", "Checkpoints this process has written completely to --checkpoint-dir.",
               static_cast<double>(written), {}, true});
  if (written > 0)
    g.push_back({"last_checkpoint_timestamp_seconds", "Unix time the newest checkpoint was written completely.",
                 written_at});
  if (window_.size() >= 2) {
    const double seconds = window_.back().first - window_.front().first;
    if (seconds > 0)
      g.push_back({"images_per_second_1m",
                   "Samples per second of all ranks over the last minute of steps (since the first, when shorter).",
                   static_cast<double>(window_.back().second - window_.front().second) / seconds});
  }
  if (exit_code_) g.push_back(exit_code_gauge(*exit_code_));
  return g;
}

}  // namespace hpc::train

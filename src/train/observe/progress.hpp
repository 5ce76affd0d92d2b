// Progress while training (--progress): a line redrawn in place on an interactive terminal
// (log::interactive_stdout), else plain log lines every --log-every steps or every
// --progress-interval (logs, Slurm output files, mpirun's output: no \r, no escapes there);
// nothing with --quiet or --progress off.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "train/options/options.hpp"

namespace hpc::train {

struct ProgressSpec {
  ProgressStyle style = ProgressStyle::Auto;
  bool quiet = false;
  int64_t log_every = 0;         // > 0: a line every N steps
  double interval_seconds = 30;  // else: a line when this much time has passed (and at epochs' ends)
};

class Progress {
 public:
  Progress(const ProgressSpec& spec, int64_t epochs, int64_t steps_per_epoch, int64_t total_steps);
  void step(int64_t epoch, int64_t step_in_epoch, int64_t global_step, double loss, double accuracy,
            double images_per_second, double eta_seconds);
  // Ends the in-place line (before other output) and prints a full line.
  void line(const std::string& text);

 private:
  bool due(int64_t step_in_epoch, bool last, std::chrono::steady_clock::time_point now) const;

  bool quiet_, bar_, off_;
  int64_t log_every_;
  double interval_seconds_;
  int64_t epochs_, steps_per_epoch_, total_steps_;
  bool open_line_ = false;
  std::chrono::steady_clock::time_point last_draw_;
};

std::string format_duration(double seconds);  // "1h02m", "3m05s", "12s"

}  // namespace hpc::train

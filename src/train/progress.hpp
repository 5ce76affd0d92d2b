// Progress on the terminal: one line rewritten in place on a TTY, plain lines every N steps
// otherwise (logs, Slurm output files), nothing with --quiet.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace hpc::train {

class Progress {
 public:
  Progress(bool quiet, int64_t log_every, int64_t epochs, int64_t steps_per_epoch, int64_t total_steps);
  void step(int64_t epoch, int64_t step_in_epoch, int64_t global_step, double loss, double accuracy,
            double images_per_second, double eta_seconds);
  // Ends the in-place line (before other output) and prints a full line.
  void line(const std::string& text);

 private:
  bool quiet_, tty_;
  int64_t log_every_, epochs_, steps_per_epoch_, total_steps_;
  bool open_line_ = false;
  std::chrono::steady_clock::time_point last_draw_{};
};

std::string format_duration(double seconds);  // "1h02m", "3m05s", "12s"

}  // namespace hpc::train

#include "train/observe/progress.hpp"

#include <algorithm>
#include <cstdio>

#include "core/log.hpp"

namespace hpc::train {

std::string format_duration(double s) {
  char buf[32];
  const long t = static_cast<long>(s + 0.5);
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, t / 60 % 60);
  else if (t >= 60) std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%lds", t);
  return buf;
}

Progress::Progress(const ProgressSpec& spec, int64_t epochs, int64_t steps_per_epoch, int64_t total_steps)
    : quiet_(spec.quiet || log::rank() != 0),
      bar_(spec.style == ProgressStyle::Bar || (spec.style == ProgressStyle::Auto && log::interactive_stdout())),
      off_(spec.style == ProgressStyle::Off),
      log_every_(spec.log_every),
      interval_seconds_(spec.interval_seconds),
      epochs_(epochs),
      steps_per_epoch_(steps_per_epoch),
      total_steps_(total_steps),
      last_draw_(std::chrono::steady_clock::now()) {}

// Whether this step gets a line: the bar at most 10 times a second; lines every --log-every
// steps, or every --progress-interval; both at an epoch's (and the run's) last step.
bool Progress::due(int64_t s, bool last, std::chrono::steady_clock::time_point now) const {
  if (last) return true;
  const double since = std::chrono::duration<double>(now - last_draw_).count();
  if (bar_) return since >= 0.1;
  if (log_every_ > 0) return (s + 1) % log_every_ == 0;
  return since >= interval_seconds_;
}

void Progress::step(int64_t epoch, int64_t s, int64_t global_step, double loss, double acc, double ips,
                    double eta_seconds) {
  if (quiet_ || off_) return;
  const bool last = global_step + 1 == total_steps_ || s + 1 == steps_per_epoch_;
  const auto now = std::chrono::steady_clock::now();
  if (!due(s, last, now)) return;
  last_draw_ = now;
  char buf[256];
  std::snprintf(buf, sizeof buf, "epoch %lld/%lld  step %lld/%lld  loss %.4f  acc %5.2f%%  %.0f img/s  ETA %s",
                static_cast<long long>(epoch + 1), static_cast<long long>(epochs_), static_cast<long long>(s + 1),
                static_cast<long long>(steps_per_epoch_), loss, 100 * acc, ips, format_duration(eta_seconds).c_str());
  if (bar_) {
    std::printf("\r\033[K%s", buf);
    std::fflush(stdout);
    open_line_ = true;
  } else {
    log::info(buf);
  }
}

void Progress::line(const std::string& text) {
  if (quiet_) return;
  if (open_line_) {
    std::printf("\n");
    open_line_ = false;
  }
  log::info(text);
}

}  // namespace hpc::train

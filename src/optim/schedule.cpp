#include "optim/schedule.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"

namespace hpc::optim {
namespace {
// Cosine interpolation from a (at t = 0) to b (at t = 1).
double cosine(double a, double b, double t) { return b + (a - b) * 0.5 * (1 + std::cos(M_PI * t)); }
}  // namespace

LrSchedule::LrSchedule(ScheduleSpec spec) : spec_(std::move(spec)) {
  HPC_REQUIRE(spec_.lr > 0 && std::isfinite(spec_.lr), "--lr must be a positive number, got ", spec_.lr);
  HPC_REQUIRE(spec_.warmup_samples >= 0, "--warmup-epochs must not be negative");
  HPC_REQUIRE(spec_.pct_start > 0 && spec_.pct_start < 1, "--onecycle-pct-start must be in (0, 1)");
  HPC_REQUIRE(spec_.div_factor >= 1 && spec_.final_div_factor >= 1, "one-cycle divisors must be >= 1");
  HPC_REQUIRE(spec_.gamma > 0, "--lr-gamma must be positive");
  HPC_REQUIRE(spec_.base_momentum >= 0 && spec_.base_momentum <= spec_.max_momentum && spec_.max_momentum < 1,
              "one-cycle momentum needs 0 <= base <= max < 1, got ", spec_.base_momentum, " and ",
              spec_.max_momentum);
  std::sort(spec_.step_samples.begin(), spec_.step_samples.end());
}

double LrSchedule::base(double s) const {
  const double total = std::max(spec_.total_samples, 1.0);
  const double t = std::clamp(s / total, 0.0, 1.0);
  if (spec_.kind == Schedule::Constant) return spec_.lr;
  if (spec_.kind == Schedule::Step) {
    double lr = spec_.lr;
    for (double m : spec_.step_samples)
      if (s >= m) lr *= spec_.gamma;
    return lr;
  }
  if (spec_.kind == Schedule::Cosine) return cosine(spec_.lr, spec_.min_lr, t);
  // onecycle
  const double initial = spec_.lr / spec_.div_factor;
  const double final_lr = initial / spec_.final_div_factor;
  if (t <= spec_.pct_start) return cosine(initial, spec_.lr, t / spec_.pct_start);
  return cosine(spec_.lr, final_lr, (t - spec_.pct_start) / (1 - spec_.pct_start));
}

double LrSchedule::momentum(double s, double fixed) const {
  if (spec_.kind != Schedule::OneCycle || !spec_.cycle_momentum) return fixed;
  const double t = std::clamp(s / std::max(spec_.total_samples, 1.0), 0.0, 1.0);
  if (t <= spec_.pct_start) return cosine(spec_.max_momentum, spec_.base_momentum, t / spec_.pct_start);
  return cosine(spec_.base_momentum, spec_.max_momentum, (t - spec_.pct_start) / (1 - spec_.pct_start));
}

double LrSchedule::lr(double s) const {
  const double b = base(s);
  if (spec_.warmup_samples > 0 && s < spec_.warmup_samples) return b * (s / spec_.warmup_samples);
  return b;
}

}  // namespace hpc::optim

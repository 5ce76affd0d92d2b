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
  const Phase ph = onecycle_phase(s);
  return ph.rising ? cosine(initial, spec_.lr, ph.t) : cosine(spec_.lr, final_lr, ph.t);
}

// As PyTorch's OneCycleLR (two phases) with step k = samples_seen / samples_per_step: rising
// while k <= pct_start*T - 1, t = k / (pct_start*T - 1); then t = (k - rise end) / (T - 1 -
// rise end), 1 at the last step, T - 1. A rising phase that ends at or before the first step
// is skipped (PyTorch divides by zero when it ends there), and t stays within [0, 1].
LrSchedule::Phase LrSchedule::onecycle_phase(double s) const {
  const double total = std::max(spec_.total_samples, 1.0);
  const double rise_end = spec_.pct_start * total - spec_.samples_per_step;
  const double fall_end = std::max(total - spec_.samples_per_step, rise_end);
  if (rise_end > 0 && s <= rise_end) return {true, std::clamp(s / rise_end, 0.0, 1.0)};
  if (fall_end <= rise_end) return {false, 1.0};
  return {false, std::clamp((s - rise_end) / (fall_end - rise_end), 0.0, 1.0)};
}

double LrSchedule::momentum(double s, double fixed) const {
  if (spec_.kind != Schedule::OneCycle || !spec_.cycle_momentum) return fixed;
  const Phase ph = onecycle_phase(s);
  return ph.rising ? cosine(spec_.max_momentum, spec_.base_momentum, ph.t)
                   : cosine(spec_.base_momentum, spec_.max_momentum, ph.t);
}

double LrSchedule::lr(double s) const {
  const double b = base(s);
  if (spec_.warmup_samples > 0 && s < spec_.warmup_samples) return b * (s / spec_.warmup_samples);
  return b;
}

}  // namespace hpc::optim

// Learning-rate schedules. Every schedule is a function of the number of training samples
// seen, not of steps, so it survives a change of batch size or world size on resume.
#pragma once

#include <string>
#include <vector>

#include "core/choice.hpp"

namespace hpc::optim {

enum class Schedule { Constant, Step, Cosine, OneCycle };
inline constexpr Named<Schedule> kScheduleNames[] = {{"constant", Schedule::Constant},
                                                     {"step", Schedule::Step},
                                                     {"cosine", Schedule::Cosine},
                                                     {"onecycle", Schedule::OneCycle}};

struct ScheduleSpec {
  Schedule kind = Schedule::OneCycle;
  double lr = 0.1;                   // base lr (constant/step/cosine) or peak lr (onecycle)
  double total_samples = 0;          // length of the training run in samples
  // Samples per optimizer step (the global batch), for onecycle's phase ends: PyTorch's
  // OneCycleLR counts steps, and with T steps its peak is at step pct_start*T - 1 and its
  // floor at the last step, T - 1; in samples, pct_start*total - this and total - this. 0:
  // the continuous schedule (the peak at pct_start*total, the floor at total).
  double samples_per_step = 0;
  double warmup_samples = 0;         // linear warm-up from 0 over this many samples
  std::vector<double> step_samples;  // step: multiply by gamma at each of these
  double gamma = 0.1;
  double min_lr = 0;                 // cosine: floor
  // onecycle, as PyTorch's OneCycleLR: from lr/div_factor up to lr over pct_start of the run
  // (cosine), then down to lr/(div_factor*final_div_factor) (cosine).
  double pct_start = 0.3;
  double div_factor = 25;
  double final_div_factor = 1e4;
  // onecycle also cycles momentum inversely to the lr, max -> base -> max (PyTorch's
  // cycle_momentum, on by default there and so in the peer's recipe).
  bool cycle_momentum = true;
  double base_momentum = 0.85, max_momentum = 0.95;
};

class LrSchedule {
 public:
  explicit LrSchedule(ScheduleSpec spec);
  double lr(double samples_seen) const;
  // The momentum for this point of the run: cycled under onecycle, else `fixed`.
  double momentum(double samples_seen, double fixed) const;
  const ScheduleSpec& spec() const { return spec_; }

 private:
  double base(double samples_seen) const;
  // Where onecycle is at this point: in its rising phase or not, and how far through it.
  struct Phase {
    bool rising;
    double t;
  };
  Phase onecycle_phase(double samples_seen) const;
  ScheduleSpec spec_;
};

}  // namespace hpc::optim

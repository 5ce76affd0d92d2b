// Dynamic loss scaling for fp16 mixed precision (the GPU engine; plain host logic, tested on
// the CPU). fp16 gradients underflow below 6e-8: the backward pass starts from the loss times
// a scale, and the gradients are divided by it before the update. A step whose gradients are
// not finite (the scale was too large) is skipped and the scale halved; after `interval`
// good steps in a row it doubles. The defaults are PyTorch's GradScaler's, so the two skip the
// same steps on the same gradients.
#pragma once

#include <cstdint>

namespace hpc::optim {

struct LossScalerState {
  double scale = 65536.0;  // 2^16
  int64_t good_steps = 0;  // finite steps since the scale last changed
  int64_t skipped = 0;     // steps skipped in the whole run
};

class LossScaler {
 public:
  explicit LossScaler(LossScalerState state = {}, int64_t interval = 2000) : s_(state), interval_(interval) {}
  double scale() const { return s_.scale; }
  const LossScalerState& state() const { return s_; }
  // After a step: finite = whether its (all-reduced) gradients were all finite. Returns
  // whether the step counted (false: it was skipped).
  bool update(bool finite);

 private:
  LossScalerState s_;
  int64_t interval_;
};

}  // namespace hpc::optim

#include "optim/loss_scaler.hpp"

#include <algorithm>

namespace hpc::optim {

bool LossScaler::update(bool finite) {
  if (!finite) {
    // Never below 1: at 1 the scale changes nothing, and a non-finite gradient there is the
    // model's own (the step is still skipped).
    s_.scale = std::max(1.0, s_.scale * 0.5);
    s_.good_steps = 0;
    ++s_.skipped;
    return false;
  }
  if (++s_.good_steps >= interval_) {
    s_.scale = std::min(s_.scale * 2.0, 16777216.0 * 65536.0);  // 2^40: far past any useful scale
    s_.good_steps = 0;
  }
  return true;
}

}  // namespace hpc::optim

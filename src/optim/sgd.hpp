// SGD with momentum, Nesterov and decoupled-from-nothing L2 weight decay, as torch.optim.SGD:
//   g = grad + wd * p;  v = mu * v + g;  p -= lr * (nesterov ? g + mu * v : v)
// over the whole parameter arena in one pass. Which tensors are decayed is a table built from
// the parameters' roles: weights always, biases and batch-norm parameters unless asked not to
// (torch.optim.SGD decays every parameter it is given).
#pragma once

#include <vector>

#include "core/arena.hpp"

namespace hpc::optim {

// Whether Sgd's step rounds each a * b + c once (a fused multiply-add: where the CPU this was
// built for has FMA) or twice. The GPU update (kernels::sgd_step) rounds as it is told, so that
// both give the same bits.
bool sgd_fuses_multiply_add();

struct SgdSpec {
  double momentum = 0.9;
  bool nesterov = true;
  double weight_decay = 5e-4;
  bool decay_bias_and_norm = true;
};

template <class T>
class Sgd {
 public:
  Sgd(const ParamStore<T>& params, SgdSpec spec);
  void step(ParamStore<T>& params, double lr) { step(params, lr, spec_.momentum); }
  // With a momentum for this step (schedules that cycle it).
  void step(ParamStore<T>& params, double lr, double momentum);
  Tensor& momentum_buffer() { return velocity_; }
  const Tensor& momentum_buffer() const { return velocity_; }
  const SgdSpec& spec() const { return spec_; }

  // The decay table: one range per parameter tensor, in arena order, covering the arena (the
  // GPU update, kernels::sgd_step, takes it as range ends and decays).
  struct Range {
    int64_t begin, end;
    bool decay;
  };
  const std::vector<Range>& ranges() const { return ranges_; }

 private:
  SgdSpec spec_;
  std::vector<Range> ranges_;  // one per parameter tensor, in arena order
  Tensor velocity_;            // same layout as the parameter arena
};

}  // namespace hpc::optim

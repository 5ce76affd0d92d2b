#include "train/engine/training_state.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace hpc::train {
namespace {

void copy_into(std::vector<float>& v, const Tensor& t) {
  const float* p = t.numel() ? t.data<float>() : nullptr;
  v.assign(p, p + t.numel());  // keeps v's capacity
}

bool all_finite(const float* p, size_t n) {
  return std::all_of(p, p + n, [](float v) { return std::isfinite(v); });
}

bool all_finite(const Tensor& t) {
  return all_finite(t.numel() ? t.data<float>() : nullptr, static_cast<size_t>(t.numel()));
}

void load_into(Tensor& t, const std::vector<float>& v, const char* what) {
  HPC_REQUIRE(static_cast<int64_t>(v.size()) == t.numel(), "the checkpoint's ", what, " hold ", v.size(),
              " values; this model has ", t.numel());
  if (!v.empty()) std::memcpy(t.data<float>(), v.data(), v.size() * sizeof(float));
}

}  // namespace

void copy_state(ckpt::Checkpoint& c, const nn::Model<float>& model, const optim::Sgd<float>& sgd) {
  copy_into(c.params, model.params().values());
  copy_into(c.momentum, sgd.momentum_buffer());
  copy_into(c.buffers, model.params().buffers());
}

void load_state(const ckpt::Checkpoint& c, nn::Model<float>& model, optim::Sgd<float>& sgd) {
  apply_model_state(c, model);
  load_into(sgd.momentum_buffer(), c.momentum, "optimizer state");
}

void apply_model_state(const ckpt::Checkpoint& c, nn::Model<float>& model) {
  load_into(model.params().values(), c.params, "parameters");
  load_into(model.params().buffers(), c.buffers, "batch-norm statistics");
  require_valid_norm_statistics(c, model);
}

void require_valid_norm_statistics(const ckpt::Checkpoint& c, const nn::Model<float>& model) {
  for (const BufferSlot& slot : model.params().buffer_slots()) {
    if (!slot.name.ends_with(".running_var")) continue;
    for (int64_t k = 0; k < slot.shape.numel(); ++k) {
      const size_t at = static_cast<size_t>(slot.offset + k);
      HPC_REQUIRE(at < c.buffers.size(), "the checkpoint's batch-norm statistics hold ", c.buffers.size(),
                  " values, fewer than its model's");
      HPC_REQUIRE(c.buffers[at] >= 0, "the checkpoint's batch-norm statistics are invalid: ", slot.name, " holds ",
                  c.buffers[at], " (a variance below zero)");
    }
  }
}

void record_loss_scaler(ckpt::Checkpoint& c, const optim::LossScalerState& s) {
  c.meta["loss_scale"] = meta_text(s.scale);
  c.meta["loss_scale_good_steps"] = meta_text(s.good_steps);
  c.meta["skipped_steps"] = meta_text(s.skipped);
}

std::optional<optim::LossScalerState> loss_scaler_of(const ckpt::Checkpoint& c) {
  if (!c.meta.count("loss_scale")) return std::nullopt;
  const optim::LossScalerState s{c.number("loss_scale"), c.integer("loss_scale_good_steps"),
                                 c.integer("skipped_steps")};
  HPC_REQUIRE(s.scale >= 1 && s.good_steps >= 0 && s.skipped >= 0, "the checkpoint's loss scale is invalid (",
              s.scale, ")");
  return s;
}

const char* describe(StatePart part) {
  switch (part) {
    case StatePart::Parameters: return "the parameters";
    case StatePart::Momentum: return "the optimizer's momentum";
    case StatePart::NormStatistics: return "the batch-norm statistics";
  }
  return "the state";
}

std::optional<StatePart> first_non_finite(const ckpt::Checkpoint& c) {
  if (!all_finite(c.params.data(), c.params.size())) return StatePart::Parameters;
  if (!all_finite(c.momentum.data(), c.momentum.size())) return StatePart::Momentum;
  if (!all_finite(c.buffers.data(), c.buffers.size())) return StatePart::NormStatistics;
  return std::nullopt;
}

std::optional<StatePart> first_non_finite(const nn::Model<float>& model, const optim::Sgd<float>& sgd) {
  if (!all_finite(model.params().values())) return StatePart::Parameters;
  if (!all_finite(sgd.momentum_buffer())) return StatePart::Momentum;
  if (!all_finite(model.params().buffers())) return StatePart::NormStatistics;
  return std::nullopt;
}

}  // namespace hpc::train

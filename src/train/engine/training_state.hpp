// The training state an engine holds (train/engine/engine.hpp) in a checkpoint: a host model's parameters
// and batch-norm statistics and the optimizer's momentum in its arenas, fp16's loss scaler in its
// meta section, and back; and which part of it holds a value that is not finite. Below the run's
// record in a checkpoint (checkpointing.hpp: the position, the options, the model's identity,
// finding and checking the one to resume from), of which the engines, that snapshot and restore
// the state, need nothing.
#pragma once

#include <optional>
#include <sstream>
#include <string>

#include "ckpt/checkpoint.hpp"
#include "nn/model.hpp"
#include "optim/loss_scaler.hpp"
#include "optim/sgd.hpp"

namespace hpc::train {

// A number as a checkpoint's meta section keeps it (the run's record, the loss scaler's keys):
// every digit a double needs to read back the same.
template <class V>
std::string meta_text(const V& v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

// The state held by a host model and optimizer into c's arenas (keeping their capacity: see
// ckpt::AsyncWriter::recycled), and back (a usage error when c's do not fit). The CPU engine's
// snapshot and restore, and the GPU engine's through its host mirror.
void copy_state(ckpt::Checkpoint& c, const nn::Model<float>& model, const optim::Sgd<float>& sgd);
void load_state(const ckpt::Checkpoint& c, nn::Model<float>& model, optim::Sgd<float>& sgd);
// Parameters and batch-norm statistics only (inference).
void apply_model_state(const ckpt::Checkpoint& c, nn::Model<float>& model);
// A usage error where c's batch-norm statistics (in model's layout) hold a variance below zero:
// no run leaves one (the batch's is clamped at zero); one in an edited file, its checksums made
// anew, made every value it normalises NaN, and evaluate, predict, export and --init-from went on
// and said nothing. apply_model_state checks it, and a resume before it looks at the run.
void require_valid_norm_statistics(const ckpt::Checkpoint& c, const nn::Model<float>& model);

// fp16 runs' dynamic loss scale and its counters (keys loss_scale, loss_scale_good_steps,
// skipped_steps), so a resumed run scales as the first would have; nullopt in a checkpoint of
// another precision, a usage error when they are invalid.
void record_loss_scaler(ckpt::Checkpoint& c, const optim::LossScalerState& s);
std::optional<optim::LossScalerState> loss_scaler_of(const ckpt::Checkpoint& c);

// The parts of a training state, in the order a problem with them is reported.
enum class StatePart { Parameters, Momentum, NormStatistics };
const char* describe(StatePart part);  // "the parameters", "the optimizer's momentum", ...
// The first part holding a value that is not finite, of a checkpoint or of a host model and
// optimizer.
std::optional<StatePart> first_non_finite(const ckpt::Checkpoint& c);
std::optional<StatePart> first_non_finite(const nn::Model<float>& model, const optim::Sgd<float>& sgd);

}  // namespace hpc::train

#include "train/checkpointing.hpp"

#include <chrono>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>

#include "ckpt/store.hpp"
#include "core/error.hpp"
#include "core/hash.hpp"
#include "core/log.hpp"
#include "dist/agree.hpp"

namespace hpc::train {
namespace {

// Options a resumed run may change: they do not change what a step computes (the global
// batch is the checkpoint's whatever --batch-size says; see check_resumable).
const std::set<std::string>& free_on_resume() {
  static const std::set<std::string> names{"batch-size", "global-batch-size", "eval-batch-size", "test-samples",
                                           "bucket-mb",  "no-overlap",        "device",          "init",
                                           "precision",  "no-deterministic",  "cuda-graphs"};
  return names;
}

// Names and shapes of every parameter and buffer: two models with the same layout have the
// same signature.
std::string model_signature(const ParamStore<float>& p) {
  std::ostringstream s;
  for (const auto& slot : p.slots()) s << slot.name << slot.shape.str() << ';';
  for (const auto& slot : p.buffer_slots()) s << slot.name << slot.shape.str() << ';';
  const std::string text = s.str();
  return fnv1a_hex(text.data(), text.size());
}

template <class V>
std::string str(const V& v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

void copy_into(std::vector<float>& v, const Tensor& t) {
  const float* p = t.numel() ? t.data<float>() : nullptr;
  v.assign(p, p + t.numel());  // keeps v's capacity
}

void load_into(Tensor& t, const std::vector<float>& v, const char* what) {
  HPC_REQUIRE(static_cast<int64_t>(v.size()) == t.numel(), "the checkpoint's ", what, " hold ", v.size(),
              " values; this model has ", t.numel());
  if (!v.empty()) std::memcpy(t.data<float>(), v.data(), v.size() * sizeof(float));
}

}  // namespace

ckpt::Checkpoint make_checkpoint(const TrainOptions& o, const nn::Model<float>& model, const optim::Sgd<float>& sgd,
                                 int world, const RunPosition& at) {
  ckpt::Checkpoint c;
  fill_checkpoint(c, o, model, sgd, world, at);
  return c;
}

void fill_checkpoint(ckpt::Checkpoint& c, const TrainOptions& o, const nn::Model<float>& model,
                     const optim::Sgd<float>& sgd, int world, const RunPosition& at) {
  auto& m = c.meta;
  m.clear();
  m["hpctrain_version"] = HPCTRAIN_VERSION;
  m["model"] = model.spec().name;
  m["model_signature"] = model_signature(model.params());
  m["time"] = str(std::chrono::duration_cast<std::chrono::seconds>(
                      std::chrono::system_clock::now().time_since_epoch()).count());
  m["world_size"] = str(world);
  m["step"] = str(at.step);
  m["epoch"] = str(at.epoch);
  m["step_in_epoch"] = str(at.step_in_epoch);
  m["global_batch_size"] = str(at.global_batch);
  m["samples_seen"] = str(at.samples_seen);
  if (at.scaler) {
    m["loss_scale"] = str(at.scaler->scale);
    m["loss_scale_good_steps"] = str(at.scaler->good_steps);
    m["skipped_steps"] = str(at.scaler->skipped);
  }
  for (const auto& [name, value] : option_values(o)) m["option." + name] = value;
  copy_into(c.params, model.params().values());
  copy_into(c.momentum, sgd.momentum_buffer());
  copy_into(c.buffers, model.params().buffers());
}

std::optional<ckpt::Checkpoint> read_on_rank0(dist::ProcessContext& ctx, const CheckpointReader& read,
                                              std::string* path) {
  std::optional<ckpt::Checkpoint> found;
  dist::collectively(ctx, [&] {
    if (ctx.rank() != 0) return;
    if (auto got = read()) {
      *path = got->first;
      found = std::move(got->second);
    }
  });
  dist::Communicator& comm = ctx.world();
  if (comm.size() == 1) return found;
  std::vector<char> bytes = found ? ckpt::encode(*found) : std::vector<char>{};
  uint64_t n = bytes.size();
  comm.broadcast(&n, sizeof n, 0);
  *path = dist::broadcast_string(comm, *path, 0);
  if (n == 0) return std::nullopt;
  bytes.resize(n);
  comm.broadcast(bytes.data(), static_cast<int64_t>(n), 0);
  return ckpt::decode(bytes, "the checkpoint received from rank 0");
}

std::optional<ckpt::Checkpoint> find_resume(const TrainOptions& o, dist::ProcessContext& ctx, std::string* path) {
  return read_on_rank0(
      ctx,
      [&]() -> std::optional<std::pair<std::string, ckpt::Checkpoint>> {
        if (o.resume == "none") return std::nullopt;
        if (o.resume == "auto") return o.checkpoint_dir.empty() ? std::nullopt : ckpt::load_latest(o.checkpoint_dir);
        std::error_code ec;
        HPC_REQUIRE(!std::filesystem::is_directory(o.resume, ec), "--resume ", o.resume, " is a directory: give a "
                    "checkpoint file in it, or the directory as --checkpoint-dir (--resume auto takes its newest)");
        return std::make_pair(o.resume, ckpt::load_checkpoint(o.resume));
      },
      path);
}

std::pair<std::string, ckpt::Checkpoint> load_checkpoint_or_latest(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return {path, ckpt::load_checkpoint(path)};
  ckpt::LatestCheckpoint latest = ckpt::find_latest(path);
  HPC_REQUIRE(latest.listed > 0, "no checkpoints (ckpt-*.hpck) in ", path);
  HPC_REQUIRE(latest.found, "none of the ", latest.listed, " checkpoint(s) in ", path, " is valid; the newest: ",
              latest.skipped.front());
  for (const std::string& problem : latest.skipped) log::warn(problem, "; using ", latest.found->first);
  return std::move(*latest.found);
}

nn::ModelSpec model_spec_of(const ckpt::Checkpoint& c, const data::Dataset& ds) {
  nn::ModelSpec spec;
  spec.name = c.text("model");
  spec.batch_norm = c.text("option.no-batch-norm") == "0";
  spec.label_smoothing = c.number("option.label-smoothing");
  spec.input = Shape{ds.height, ds.width, ds.channels};
  spec.classes = ds.classes;
  return spec;
}

void check_model(const ckpt::Checkpoint& c, const nn::Model<float>& model) {
  HPC_REQUIRE(c.text("model") == model.spec().name, "the checkpoint is of model ", c.text("model"), ", not ",
              model.spec().name, " (--model)");
  HPC_REQUIRE(c.text("model_signature") == model_signature(model.params()),
              "the checkpoint's parameters do not fit this ", model.spec().name,
              " (another variant, dataset shape or number of classes)");
}

RunPosition check_resumable(const ckpt::Checkpoint& c, const TrainOptions& o, const nn::Model<float>& model) {
  check_model(c, model);
  for (const auto& [name, value] : option_values(o)) {
    if (free_on_resume().count(name)) continue;
    auto it = c.meta.find("option." + name);
    HPC_REQUIRE(it != c.meta.end(), "the checkpoint does not record --", name);
    HPC_REQUIRE(it->second == value, "the checkpoint was made with --", name, "=", it->second, ", this run has --",
                name, "=", value, " (resume with the same value, or start afresh with --resume none)");
  }
  RunPosition at;
  at.step = c.integer("step");
  at.epoch = c.integer("epoch");
  at.step_in_epoch = c.integer("step_in_epoch");
  at.global_batch = c.integer("global_batch_size");
  at.samples_seen = c.number("samples_seen");
  if (c.meta.count("loss_scale")) {
    at.scaler = optim::LossScalerState{c.number("loss_scale"), c.integer("loss_scale_good_steps"),
                                       c.integer("skipped_steps")};
    HPC_REQUIRE(at.scaler->scale >= 1 && at.scaler->good_steps >= 0 && at.scaler->skipped >= 0,
                "the checkpoint's loss scale is invalid (", at.scaler->scale, ")");
  }
  HPC_REQUIRE(at.step >= 0 && at.epoch >= 0 && at.step_in_epoch >= 0 && at.global_batch > 0,
              "the checkpoint's position is invalid (step ", at.step, ", epoch ", at.epoch, ")");
  HPC_REQUIRE(o.global_batch_size == 0 || o.global_batch_size == at.global_batch, "the checkpoint was made with a ",
              "global batch of ", at.global_batch, "; --global-batch-size ", o.global_batch_size,
              " would change what every later step computes");
  return at;
}

void apply_model_state(const ckpt::Checkpoint& c, nn::Model<float>& model) {
  load_into(model.params().values(), c.params, "parameters");
  load_into(model.params().buffers(), c.buffers, "batch-norm statistics");
}

void apply_checkpoint(const ckpt::Checkpoint& c, nn::Model<float>& model, optim::Sgd<float>& sgd) {
  apply_model_state(c, model);
  load_into(sgd.momentum_buffer(), c.momentum, "optimizer state");
}

}  // namespace hpc::train

#include <cmath>

#include "core/error.hpp"
#include "core/hash.hpp"
#include "core/log.hpp"
#include "data/shards.hpp"
#include "dist/agree.hpp"
#include "train/serve/serving.hpp"
#include "train/state/checkpointing.hpp"

namespace hpc::train {
namespace {

// Packed shards' class names: the checkpoint's own (a --data-dir must agree with them), or, in a
// checkpoint written before they were recorded, the packed dataset's. A dataset's are read as
// training read them, from its manifests (data::packed_class_names): a classes.txt edited or left
// stale there refused the very dataset a model was trained on, or named an older checkpoint's
// classes otherwise than its training had.
std::vector<std::string> shard_classes(const ckpt::Checkpoint& c, const std::string& data_dir, bool speak) {
  const std::optional<std::vector<std::string>> recorded = class_names_of(c);
  if (recorded && !data_dir.empty())
    require_same_classes(c, data::packed_class_names(data_dir), "--data-dir " + data_dir,
                         ": leave --data-dir out, the checkpoint names its classes");
  if (recorded) return *recorded;
  HPC_REQUIRE(!data_dir.empty(), "the checkpoint's ", c.text("model"), " was trained on packed shards and records "
              "no class names (written before 2026-11-26): pass --data-dir DIR (the packed dataset it was trained on)");
  std::vector<std::string> names = data::packed_class_names(data_dir);
  if (speak)
    log::warn("the checkpoint records no class names (written before 2026-11-26); using those of the packed dataset ",
              data_dir);
  return names;
}

data::DatasetFacts facts_of(const ckpt::Checkpoint& c, const std::string& data_dir, bool speak) {
  // Checkpoints written before --image-size was recorded were of the datasets' own sizes (0).
  const TrainOptions recorded = records_option(c.meta, "image-size") ? recorded_options(c.meta, {"dataset", "image-size"})
                                                                      : recorded_options(c.meta, {"dataset"});
  const std::string dataset = data::dataset_name(recorded.dataset);
  const int64_t image_size = recorded.image_size;
  // Another dataset's classes are fixed: a --data-dir there named nothing, and was passed over in
  // silence (the user left believing their packed dataset was checked). Refused as --image-size is
  // for a dataset it does not apply to.
  HPC_REQUIRE(recorded.dataset == data::DatasetKind::Shards || data_dir.empty(), "--data-dir applies to a model "
              "trained on packed shards only; the checkpoint's ", c.text("model"), " was trained on ", dataset,
              ", whose classes are fixed: leave --data-dir out");
  if (recorded.dataset != data::DatasetKind::Shards) return data::dataset_facts(dataset, image_size);
  return data::dataset_facts(dataset, image_size, shard_classes(c, data_dir, speak));
}

}  // namespace

std::string ServingModel::param_checksum() const {
  return fnv1a_hex(checkpoint.params.data(), checkpoint.params.size() * sizeof(float));
}

namespace {
// The checkpoint's model, for a dataset of these facts, holding the checkpoint's parameters.
std::unique_ptr<nn::Model<float>> fitted_model(const ckpt::Checkpoint& c, const data::DatasetFacts& facts) {
  data::Dataset shape;  // the model's view of its dataset: only the sample shape and classes
  shape.height = facts.height;
  shape.width = facts.width;
  shape.channels = facts.channels;
  shape.classes = facts.classes;
  auto model = std::make_unique<nn::Model<float>>(model_spec_of(c, shape));
  check_model(c, *model);
  apply_model_state(c, *model);
  return model;
}
}  // namespace

std::optional<std::string> model_misfit(const ckpt::Checkpoint& c) {
  try {
    // What every resume of it checks first, whatever the run: its position, its state's values.
    recorded_position(c);
    if (const std::optional<StatePart> part = first_non_finite(c))
      usage_error("it holds a state that is not finite (", describe(*part), "; its run had diverged)");
    const bool shards = recorded_options(c.meta, {"dataset"}).dataset == data::DatasetKind::Shards;
    if (!shards || class_names_of(c)) fitted_model(c, facts_of(c, "", false));
    check_optimizer_state(c);
  } catch (const Error& e) {
    return e.what();
  }
  return std::nullopt;
}

ServingModel load_serving_model(const std::string& checkpoint, const std::string& data_dir, dist::ProcessContext& ctx) {
  ServingModel s;
  using Found = std::optional<std::pair<std::string, ckpt::Checkpoint>>;
  std::optional<ckpt::Checkpoint> c =
      read_on_rank0(ctx, [&]() -> Found { return load_checkpoint_or_latest(checkpoint); }, &s.path);
  s.checkpoint = std::move(*c);
  dist::collectively(ctx, [&] {
    // A position no run writes (step -5), which inspect and evaluate refuse: export wrote it into
    // the model's metadata as its step.
    recorded_position(s.checkpoint);
    s.facts = facts_of(s.checkpoint, data_dir, ctx.rank() == 0);
    s.model = fitted_model(s.checkpoint, s.facts);
    ckpt::require_finite_state(s.checkpoint, s.path);
  });
  return s;
}

}  // namespace hpc::train

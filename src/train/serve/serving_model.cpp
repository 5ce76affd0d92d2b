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
// checkpoint written before they were recorded, the packed dataset's classes.txt.
std::vector<std::string> shard_classes(const ckpt::Checkpoint& c, const std::string& data_dir, bool speak) {
  const std::optional<std::vector<std::string>> recorded = class_names_of(c);
  if (recorded && !data_dir.empty())
    require_same_classes(c, data::read_class_names(data_dir), "--data-dir " + data_dir + "/classes.txt",
                         ": leave --data-dir out, the checkpoint names its classes");
  if (recorded) return *recorded;
  HPC_REQUIRE(!data_dir.empty(), "the checkpoint's ", c.text("model"), " was trained on packed shards and records "
              "no class names (written before 2026-11-26): pass --data-dir DIR (the directory with its classes.txt)");
  std::vector<std::string> names = data::read_class_names(data_dir);
  if (speak)
    log::warn("the checkpoint records no class names (written before 2026-11-26); using ", data_dir, "/classes.txt");
  return names;
}

data::DatasetFacts facts_of(const ckpt::Checkpoint& c, const std::string& data_dir, bool speak) {
  // Checkpoints written before --image-size was recorded were of the datasets' own sizes (0).
  const TrainOptions recorded = records_option(c.meta, "image-size") ? recorded_options(c.meta, {"dataset", "image-size"})
                                                                      : recorded_options(c.meta, {"dataset"});
  const std::string dataset = data::dataset_name(recorded.dataset);
  const int64_t image_size = recorded.image_size;
  if (recorded.dataset != data::DatasetKind::Shards) return data::dataset_facts(dataset, image_size);
  return data::dataset_facts(dataset, image_size, shard_classes(c, data_dir, speak));
}

}  // namespace

std::string ServingModel::param_checksum() const {
  return fnv1a_hex(checkpoint.params.data(), checkpoint.params.size() * sizeof(float));
}

ServingModel load_serving_model(const std::string& checkpoint, const std::string& data_dir, dist::ProcessContext& ctx) {
  ServingModel s;
  using Found = std::optional<std::pair<std::string, ckpt::Checkpoint>>;
  std::optional<ckpt::Checkpoint> c =
      read_on_rank0(ctx, [&]() -> Found { return load_checkpoint_or_latest(checkpoint); }, &s.path);
  s.checkpoint = std::move(*c);
  dist::collectively(ctx, [&] {
    s.facts = facts_of(s.checkpoint, data_dir, ctx.rank() == 0);
    data::Dataset shape;  // the model's view of its dataset: only the sample shape and classes
    shape.height = s.facts.height;
    shape.width = s.facts.width;
    shape.channels = s.facts.channels;
    shape.classes = s.facts.classes;
    s.model = std::make_unique<nn::Model<float>>(model_spec_of(s.checkpoint, shape));
    check_model(s.checkpoint, *s.model);
    ckpt::require_finite_state(s.checkpoint, s.path);
    apply_model_state(s.checkpoint, *s.model);
  });
  return s;
}

}  // namespace hpc::train

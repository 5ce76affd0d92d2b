#include "train/state/checkpointing.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <sstream>

#include "ckpt/store.hpp"
#include "core/error.hpp"
#include "core/hash.hpp"
#include "core/json.hpp"
#include "core/log.hpp"
#include "core/revision.hpp"
#include "data/shards.hpp"
#include "dist/agree.hpp"
#include "dist/communicator.hpp"

namespace hpc::train {
namespace {

// Names and shapes of every parameter and buffer: two models with the same layout have the
// same signature. `rename`, where given, names each tensor otherwise (pool_free_name).
std::string model_signature(const ParamStore<float>& p,
                            const std::function<std::string(const std::string&)>& rename = {}) {
  std::ostringstream s;
  auto named = [&](const std::string& name) { return rename ? rename(name) : name; };
  for (const auto& slot : p.slots()) s << named(slot.name) << slot.shape.str() << ';';
  for (const auto& slot : p.buffer_slots()) s << named(slot.name) << slot.shape.str() << ';';
  const std::string text = s.str();
  return fnv1a_hex(text.data(), text.size());
}

// A parameter's or buffer's name ("4.main.0.weight": layer indices within each Sequential) as if
// the network had no max-pool layers: each index counts the layers before it but its max pools.
// Two networks that differ only in whether a pool is a layer of its own (resnet18/50's ImageNet
// stem and their CIFAR stem; that stem before 2026-12-04, whose 2x2/2 pool was fused into its
// batch norm) give their same layers the same such names.
std::string pool_free_name(const nn::Sequential<float>& net, const std::string& name) {
  std::string out;
  const nn::Sequential<float>* seq = &net;
  size_t at = 0;
  while (seq && at < name.size()) {  // at: the next segment, a layer index within *seq
    const size_t dot = std::min(name.find('.', at), name.size());
    const std::string index = name.substr(at, dot - at);
    size_t i = 0;
    const auto [end, ec] = std::from_chars(index.data(), index.data() + index.size(), i);
    if (ec != std::errc() || end != index.data() + index.size() || i >= seq->layers().size()) break;
    const auto& layers = seq->layers();
    const auto pools = std::count_if(layers.begin(), layers.begin() + static_cast<std::ptrdiff_t>(i),
                                     [](const nn::LayerPtr<float>& l) { return l->kind() == "maxpool2d"; });
    out += std::to_string(i - static_cast<size_t>(pools));
    at = dot;
    const nn::Layer<float>* layer = layers[i].get();
    seq = dynamic_cast<const nn::Sequential<float>*>(layer);
    if (const auto* res = dynamic_cast<const nn::Residual<float>*>(layer)) {  // ".main." or ".shortcut." next
      const size_t next = std::min(name.find('.', at + 1), name.size());
      const std::string branch = at < name.size() ? name.substr(at + 1, next - at - 1) : "";
      if (branch != "main" && branch != "shortcut") break;
      seq = branch == "main" ? &res->main() : &res->shortcut();
      out += "." + branch;
      at = next;
    }
    if (seq && at < name.size()) {
      out += '.';
      ++at;
    }
  }
  return out + name.substr(at);
}

// "cat,dog", or for a long list its first names and the count: one line either way.
std::string listed(const std::vector<std::string>& names) {
  constexpr size_t kShown = 8;
  std::string text;
  for (size_t i = 0; i < std::min(names.size(), kShown); ++i) text += (i ? "," : "") + names[i];
  if (names.size() > kShown) text += ",... (" + std::to_string(names.size()) + " classes)";
  return text;
}

constexpr const char* kEpochSumsKey = "epoch_train_sums";
constexpr const char* kEpochImagesKey = "epoch_train_images";
constexpr const char* kEpochSecondsKey = "epoch_train_seconds";
constexpr const char* kMaxPoolsKey = "max_pools";

bool has_padded_pool(const nn::Model<float>& model) {
  const std::vector<nn::PoolGeometry> pools = nn::max_pools(model.net());
  return std::any_of(pools.begin(), pools.end(), [](const nn::PoolGeometry& p) { return p.padding > 0; });
}

[[noreturn]] void refuse_old_stem(const char* name) {
  usage_error("the checkpoint's ", name, " was trained with the ImageNet stem's old 2x2/2 max pool (hpctrain before "
              "2026-12-04), this hpctrain's is torchvision's 3x3/2 padded by 1, and its weights would predict "
              "otherwise here: train it again (or use the hpctrain that made it)");
}

// Whether the checkpoint is of `model` as hpctrain made it before 2026-12-04, with the ImageNet
// stem's 2x2/2 max pool fused into the stem's batch norm (no layer of its own): the same tensors,
// each named as if the stem had no pool layer, so its layout signature is another than `model`'s.
// (Without batch norm that pool was its own layer, and the signatures agree: check_max_pools.)
bool of_the_old_fused_stem(const ckpt::Checkpoint& c, const nn::Model<float>& model) {
  if (c.meta.count(kMaxPoolsKey) || !has_padded_pool(model)) return false;
  const nn::Sequential<float>& net = model.net();
  return c.text("model_signature") ==
         model_signature(model.params(), [&net](const std::string& n) { return pool_free_name(net, n); });
}

// The model's function beyond its parameters' layout: its max pools, recorded since resnet18's
// and resnet50's ImageNet stem became torchvision's 3x3/2 pool padded by 1. It was a 2x2/2 one
// before, with the same parameters: a checkpoint without the record had no padded pool, and its
// weights in a model with one would load and predict otherwise.
void check_max_pools(const ckpt::Checkpoint& c, const nn::Model<float>& model, const char* name) {
  const std::vector<nn::PoolGeometry> pools = nn::max_pools(model.net());
  const auto recorded = c.meta.find(kMaxPoolsKey);
  if (recorded == c.meta.end()) {
    if (has_padded_pool(model)) refuse_old_stem(name);
    return;
  }
  const std::string here = nn::max_pools_text(pools);
  HPC_REQUIRE(recorded->second == here, "the checkpoint's ", name, " has the max pools \"", recorded->second,
              "\", this one \"", here, "\" (made by another hpctrain?): its weights would predict otherwise here");
}

// RunPosition::epoch_sums as recorded: empty when the key is not there (an older checkpoint's, or
// one at an epoch's start); a usage error unless 3 finite, non-negative numbers a rank.
std::vector<double> recorded_epoch_sums(const ckpt::Checkpoint& c) {
  const auto it = c.meta.find(kEpochSumsKey);
  if (it == c.meta.end()) return {};
  std::vector<double> sums;
  try {
    sums = nlohmann::json::parse(it->second).get<std::vector<double>>();
  } catch (const nlohmann::json::exception&) {
    sums.clear();  // refused below
  }
  constexpr size_t kMostRanks = size_t{1} << 24;  // far beyond any job; bounds a crafted file's
  HPC_REQUIRE(!sums.empty() && sums.size() % 3 == 0 && sums.size() <= 3 * kMostRanks &&
                  std::all_of(sums.begin(), sums.end(), [](double v) { return std::isfinite(v) && v >= 0; }),
              "the checkpoint's ", kEpochSumsKey, " is not a JSON array of 3 non-negative numbers per rank: ",
              it->second.substr(0, 80));
  return sums;
}

}  // namespace

ModelIdentity ModelIdentity::of(const nn::Model<float>& model, std::vector<std::string> class_names,
                                std::string training_set) {
  return {nn::model_name(model.spec().kind), model_signature(model.params()),
          nn::max_pools_text(nn::max_pools(model.net())), std::move(class_names), std::move(training_set), /*kernels=*/{}};
}

std::string training_set_digest(const data::Dataset& train) {
  const int64_t shape[4] = {train.count, train.height, train.width, train.channels};
  const uint64_t h = fnv1a(shape, sizeof shape);
  return hex64(fnv1a(train.labels.data(), train.labels.size() * sizeof train.labels[0], h));
}

void require_same_training_set(const ckpt::Checkpoint& c, const std::string& digest, const std::string& source) {
  const auto recorded = c.meta.find("training_set_digest");
  if (recorded == c.meta.end() || recorded->second == digest) return;
  usage_error("the checkpoint's run trained on another training set than ", source, ", or on its samples in another "
              "order (digest ", recorded->second, ", here ", digest, ": another dataset, one packed again, files "
              "replaced?), where it would not continue at the sample it stopped at: resume with the data it was made "
              "with, or begin a new run from its weights with --init-from");
}

std::string run_kernels(const std::vector<std::string>& of_each_rank) {
  return dist::distinct_joined(of_each_rank, " + ");
}

namespace {
// How the instruction set oneDNN uses is held to one (its kernels differ between AVX-512 and AVX2
// CPUs, and so do their sums' bits), where oneDNN is among what differs.
std::string isa_hint(const std::string& a, const std::string& b) {
  if (a.find("oneDNN") == std::string::npos || b.find("oneDNN") == std::string::npos) return "";
  return " (ONEDNN_MAX_CPU_ISA set to the least of these instruction sets on every host, e.g. AVX2, makes oneDNN "
         "compute alike on them)";
}
}  // namespace

std::optional<std::string> mixed_kernels_warning(const std::vector<std::string>& hosts,
                                                 const std::vector<std::string>& kernels) {
  std::vector<std::string> kinds;  // each once, in the order of their first ranks
  for (const std::string& k : kernels)
    if (std::find(kinds.begin(), kinds.end(), k) == kinds.end()) kinds.push_back(k);
  if (kinds.size() < 2) return std::nullopt;
  std::string each;
  for (const std::string& kind : kinds) {
    std::vector<std::string> on;  // the hosts of its ranks
    for (size_t r = 0; r < kernels.size(); ++r)
      if (kernels[r] == kind) on.push_back(hosts[r]);
    each += (each.empty() ? "" : "; ") + kind + " on " + dist::distinct_joined(on, ", ");
  }
  return "the ranks compute with different kernels (" + each + "): the run's bits may depend on which host each "
         "rank runs on, and a run placed otherwise (a relaunch, a requeue) may not repeat them" +
         isa_hint(kinds.front(), run_kernels(kernels));
}

std::optional<std::string> other_kernels_warning(const ckpt::Checkpoint& c, const std::string& kernels) {
  const auto recorded = c.meta.find("kernels");
  if (recorded == c.meta.end() || recorded->second == kernels) return std::nullopt;
  return "the checkpoint's run computed with " + recorded->second + ", this one computes with " + kernels +
         ": it continues from the checkpoint's state, but its bits may not be those a run never stopped would "
         "have had" + isa_hint(recorded->second, kernels);
}

void record_run(ckpt::Checkpoint& c, const TrainOptions& o, const ModelIdentity& model, int world,
                const RunPosition& at) {
  auto& m = c.meta;
  m.clear();
  m["hpctrain_version"] = HPCTRAIN_VERSION;
  m["hpctrain_revision"] = build_revision();
  m["model"] = model.name;
  m["model_signature"] = model.signature;
  m[kMaxPoolsKey] = model.max_pools;
  m["world_size"] = meta_text(world);
  if (!model.class_names.empty()) {  // so that predict and export name the classes without the dataset
    m["class_names"] = json_text(JsonObject(model.class_names));  // bytes that are not UTF-8 replaced
    m["classes_digest"] = data::class_names_digest(model.class_names);  // of the names as they were
  }
  if (!model.training_set.empty()) m["training_set_digest"] = model.training_set;
  if (!model.kernels.empty()) m["kernels"] = model.kernels;
  for (const auto& [name, value] : option_values(o)) m["option." + name] = value;
  record_position(c, at);
}

std::optional<std::vector<std::string>> class_names_of(const ckpt::Checkpoint& c) {
  if (!c.meta.count("class_names")) return std::nullopt;
  std::vector<std::string> names;
  try {
    names = nlohmann::json::parse(c.text("class_names")).get<std::vector<std::string>>();
  } catch (const nlohmann::json::exception&) {
    names.clear();  // refused below
  }
  HPC_REQUIRE(!names.empty(), "the checkpoint's class_names is not a JSON array of names: ", c.text("class_names"));
  return names;
}

void require_same_classes(const ckpt::Checkpoint& c, const std::vector<std::string>& names, const std::string& source,
                          const std::string& hint) {
  const std::optional<std::vector<std::string>> recorded = class_names_of(c);
  HPC_REQUIRE(!recorded || names.empty() || names == *recorded, source, " names the classes ", listed(names),
              " but the checkpoint's model was trained on ", listed(*recorded), " (another packed dataset?)", hint);
}

void record_position(ckpt::Checkpoint& c, const RunPosition& at) {
  auto& m = c.meta;
  m["time"] = meta_text(std::chrono::duration_cast<std::chrono::seconds>(
                      std::chrono::system_clock::now().time_since_epoch()).count());
  m["step"] = meta_text(at.step);
  m["epoch"] = meta_text(at.epoch);
  m["step_in_epoch"] = meta_text(at.step_in_epoch);
  m["global_batch_size"] = meta_text(at.global_batch);
  m["samples_seen"] = meta_text(at.samples_seen);
  // A snapshot's record is reused from one position to the next: sums of an earlier one go.
  if (at.epoch_sums.empty()) m.erase(kEpochSumsKey);
  else m[kEpochSumsKey] = json_text(JsonObject(at.epoch_sums));
  if (at.epoch_unended()) {
    m[kEpochImagesKey] = meta_text(at.epoch_images);
    m[kEpochSecondsKey] = meta_text(at.epoch_seconds);
  } else {
    m.erase(kEpochImagesKey);
    m.erase(kEpochSecondsKey);
  }
}

namespace {
// Each of `to_slots` whose name and shape `from_slots` holds, copied from `from` into `to`. Names
// are compared as if neither network had max-pool layers (pool_free_name): the ImageNet stem's
// pool, a layer of its own, put every later layer one index above the CIFAR stem's, and a block's
// tensors went into the next block's where their shapes fit.
template <class Slot>
void copy_fitting(const nn::Sequential<float>& from_net, const std::vector<Slot>& from_slots, const Tensor& from,
                  const nn::Sequential<float>& to_net, const std::vector<Slot>& to_slots, Tensor& to, FittingState& s) {
  std::vector<std::string> from_names;
  for (const Slot& f : from_slots) from_names.push_back(pool_free_name(from_net, f.name));
  for (const Slot& slot : to_slots) {
    ++s.total;
    const std::string name = pool_free_name(to_net, slot.name);
    const auto it = std::find_if(from_slots.begin(), from_slots.end(), [&](const Slot& f) {
      return from_names[static_cast<size_t>(&f - from_slots.data())] == name && f.shape == slot.shape;
    });
    if (it == from_slots.end()) {
      s.left.push_back(slot.name);
      continue;
    }
    std::memcpy(to.data<float>() + slot.offset, from.data<float>() + it->offset, slot.shape.numel() * sizeof(float));
    ++s.copied;
  }
}
}  // namespace

FittingState copy_fitting_state(const nn::Model<float>& from, nn::Model<float>& to) {
  FittingState s;
  copy_fitting(from.net(), from.params().slots(), from.params().values(), to.net(), to.params().slots(),
               to.params().values(), s);
  copy_fitting(from.net(), from.params().buffer_slots(), from.params().buffers(), to.net(), to.params().buffer_slots(),
               to.params().buffers(), s);
  return s;
}

ckpt::Checkpoint make_checkpoint(const TrainOptions& o, const nn::Model<float>& model, const optim::Sgd<float>& sgd,
                                 int world, const RunPosition& at) {
  ckpt::Checkpoint c;
  record_run(c, o, ModelIdentity::of(model), world, at);
  copy_state(c, model, sgd);
  return c;
}

std::string param_checksum(const ckpt::Checkpoint& c) {
  return fnv1a_hex(c.params.data(), c.params.size() * sizeof(float));
}

std::string state_checksum(const ckpt::Checkpoint& c) {
  uint64_t h = kFnv1aBasis;
  for (const std::vector<float>* v : {&c.params, &c.momentum, &c.buffers}) {
    const uint64_t n = v->size();  // where one arena ends and the next begins
    h = fnv1a(&n, sizeof n, h);
    h = fnv1a(v->data(), v->size() * sizeof(float), h);
  }
  std::string record;  // the meta section's text: exact, and the same on every machine
  for (const char* key : {"step", "epoch", "step_in_epoch", "global_batch_size", "samples_seen", "loss_scale",
                          "loss_scale_good_steps", "skipped_steps"}) {
    const auto it = c.meta.find(key);
    record += std::string(key) + '=' + (it == c.meta.end() ? "-" : it->second) + '\n';
  }
  return hex64(fnv1a(record.data(), record.size(), h));
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
  return share_checkpoint(ctx.world(), std::move(found), 0, path);
}

std::optional<ckpt::Checkpoint> share_checkpoint(dist::Communicator& comm, std::optional<ckpt::Checkpoint> c, int root,
                                                 std::string* path) {
  if (comm.size() == 1) return c;
  std::vector<char> bytes = c && comm.rank() == root ? ckpt::encode(*c) : std::vector<char>{};
  uint64_t n = bytes.size();
  comm.broadcast(&n, sizeof n, root);
  *path = dist::broadcast_string(comm, *path, root);
  if (n == 0) return std::nullopt;
  bytes.resize(n);
  comm.broadcast(bytes.data(), static_cast<int64_t>(n), root);
  if (comm.rank() == root) return c;
  return ckpt::decode(bytes, detail::concat("the state received from rank ", root));
}

std::optional<ckpt::Checkpoint> find_resume(const TrainOptions& o, dist::ProcessContext& ctx, std::string* path) {
  return read_on_rank0(
      ctx,
      [&]() -> std::optional<std::pair<std::string, ckpt::Checkpoint>> {
        if (o.resume == ResumeFrom::None) return std::nullopt;
        if (o.resume == ResumeFrom::Auto)
          return o.checkpoint_dir.empty() ? std::nullopt : ckpt::load_latest(o.checkpoint_dir);
        std::error_code ec;
        HPC_REQUIRE(!std::filesystem::is_directory(o.resume_file, ec), "--resume ", o.resume_file, " is a directory: "
                    "give a checkpoint file in it, or the directory as --checkpoint-dir (--resume auto takes its "
                    "newest)");
        return std::make_pair(o.resume_file, ckpt::load_checkpoint(o.resume_file));
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
  spec.kind = parse_named(nn::kModelNames, c.text("model"), "model (in the checkpoint)");
  const TrainOptions recorded = recorded_options(c.meta, {"no-batch-norm", "label-smoothing"});
  spec.batch_norm = recorded.batch_norm;
  spec.label_smoothing = recorded.label_smoothing;
  spec.input = Shape{ds.height, ds.width, ds.channels};
  spec.classes = ds.classes;
  // The rest of training's spec (build_model) is left at its defaults on purpose. spec.init (--init):
  // how a new model's weights start, which only Model::init reads; a model made from a checkpoint
  // is never init()ed, every parameter and buffer being the checkpoint's (apply_model_state, which
  // refuses other counts), so a model trained with --init kaiming-normal evaluates, exports and
  // predicts as its weights say. spec.fuse: training keeps the default too (the same results).
  return spec;
}

void check_model(const ckpt::Checkpoint& c, const nn::Model<float>& model) {
  const char* name = nn::model_name(model.spec().kind);
  HPC_REQUIRE(c.text("model") == name, "the checkpoint is of model ", c.text("model"), ", not ", name, " (--model)");
  if (c.text("model_signature") != model_signature(model.params())) {
    if (of_the_old_fused_stem(c, model)) refuse_old_stem(name);
    usage_error("the checkpoint's parameters do not fit this ", name, " (another variant, dataset shape or number of "
                "classes)");
  }
  check_max_pools(c, model, name);
}

RunPosition recorded_position(const ckpt::Checkpoint& c) {
  RunPosition at;
  at.step = c.integer("step");
  at.epoch = c.integer("epoch");
  at.step_in_epoch = c.integer("step_in_epoch");
  at.global_batch = c.integer("global_batch_size");
  at.samples_seen = c.number("samples_seen");
  at.epoch_sums = recorded_epoch_sums(c);
  if (at.epoch_unended()) {  // what the epoch's line shows (its images per second); absent: none
    at.epoch_images = c.meta.count(kEpochImagesKey) ? c.integer(kEpochImagesKey) : 0;
    at.epoch_seconds = c.meta.count(kEpochSecondsKey) ? c.number(kEpochSecondsKey) : 0;
    HPC_REQUIRE(at.epoch_images >= 0 && at.epoch_images <= (int64_t{1} << 53) && std::isfinite(at.epoch_seconds) &&
                    at.epoch_seconds >= 0,
                "the checkpoint's ", kEpochImagesKey, " (", at.epoch_images, ") or ", kEpochSecondsKey, " (",
                at.epoch_seconds, ") is invalid");
  }
  loss_scaler_of(c);  // valid, for the engine to restore
  // Bounded far beyond any run (2^31 epochs, 2^53 steps), so that the arithmetic on them (the
  // epoch shown from 1, epoch * steps per epoch) cannot overflow on a crafted file.
  constexpr int64_t kMostEpochs = int64_t{1} << 31, kMostSteps = int64_t{1} << 53;
  HPC_REQUIRE(at.step >= 0 && at.epoch >= 0 && at.step_in_epoch >= 0 && at.global_batch > 0 &&
                  at.step <= kMostSteps && at.epoch <= kMostEpochs && at.step_in_epoch <= kMostEpochs &&
                  at.global_batch <= kMostEpochs && std::isfinite(at.samples_seen) && at.samples_seen >= 0,
              "the checkpoint's position is invalid (step ", at.step, ", epoch ", at.epoch, ", samples seen ",
              at.samples_seen, ")");
  return at;
}

void check_optimizer_state(const ckpt::Checkpoint& c) {
  HPC_REQUIRE(c.momentum.size() == c.params.size(), "the checkpoint's optimizer state holds ", c.momentum.size(),
              " values for its ", c.params.size(), " parameters");
}

namespace {
// A checkpoint made under --global-batch-size recorded a --batch-size that run never used: another
// one here is named against the global batch it had, not against that unused value.
void require_batch_size_as_made(const ckpt::Checkpoint& c, const std::string& recorded, const std::string& value) {
  const auto global = c.meta.find("option.global-batch-size");
  if (recorded == value || global == c.meta.end() || global->second == "0") return;
  usage_error("the checkpoint was made with --global-batch-size ", global->second, " (its --batch-size was not used), "
              "this run has --batch-size ", value, ": resume with --global-batch-size ", global->second,
              " (or without either: a resumed run keeps the checkpoint's global batch)");
}
}  // namespace

namespace {
// Whether --train-samples values `recorded` (the checkpoint's) and `given` both take the whole of a
// training set of `count` samples (0, or at least the count).
bool both_take_all(int64_t recorded, int64_t given, int64_t count) {
  const auto all = [count](int64_t n) { return n == 0 || n >= count; };
  return all(recorded) && all(given);
}
}  // namespace

RunPosition check_resumable(const ckpt::Checkpoint& c, const TrainOptions& o, const nn::Model<float>& model,
                            int64_t training_samples) {
  check_model(c, model);
  // (Parameters of another count are the restore's error, which names them.)
  if (c.params.size() == static_cast<size_t>(model.params().values().numel())) check_optimizer_state(c);
  for (const auto& [name, value] : option_values(o)) {
    if (!must_match_on_resume(name)) continue;
    // Under --global-batch-size the per-rank batch is not this run's choice: the global batch is
    // compared below.
    if (name == "batch-size" && o.global_batch_size != 0) continue;
    // --extend-epochs: a longer run than the checkpoint's, never a shorter one.
    if (name == "epochs" && o.extend_epochs) {
      const int64_t before = recorded_options(c.meta, {"epochs"}).epochs;
      HPC_REQUIRE(o.epochs >= before, "--extend-epochs only lengthens a run: the checkpoint's has --epochs ", before,
                  ", this one --epochs ", o.epochs);
      continue;
    }
    auto it = c.meta.find("option." + name);
    HPC_REQUIRE(it != c.meta.end(), "the checkpoint does not record --", name);
    if (name == "batch-size") require_batch_size_as_made(c, it->second, value);
    if (name == "train-samples" &&
        both_take_all(recorded_options(c.meta, {name}).train_samples, o.train_samples, training_samples))
      continue;
    HPC_REQUIRE(it->second == value, "the checkpoint was made with --", name, "=", it->second, ", this run has --",
                name, "=", value, " (resume with the same value, ",
                name == "epochs" ? "or lengthen the run with --extend-epochs, " : "", "or start afresh with --resume none)");
  }
  const RunPosition at = recorded_position(c);
  HPC_REQUIRE(o.global_batch_size == 0 || o.global_batch_size == at.global_batch, "the checkpoint was made with a ",
              "global batch of ", at.global_batch, "; --global-batch-size ", o.global_batch_size,
              " would change what every later step computes");
  return at;
}

void require_position_in_run(const RunPosition& at, int64_t steps_per_epoch, int64_t epochs) {
  // A run's own checkpoints always pass: the last one stands at (epochs, 0), one ended by
  // --max-steps with fewer steps than its epochs hold.
  HPC_REQUIRE(at.epoch <= epochs && at.step_in_epoch < std::max<int64_t>(steps_per_epoch, 1) &&
                  (at.epoch < epochs || at.step_in_epoch == 0) && at.step <= at.epoch * steps_per_epoch + at.step_in_epoch,
              "the checkpoint's position (step ", at.step, ", epoch ", at.epoch + 1, ", step ", at.step_in_epoch,
              " of it) is not in this run of ", epochs, " epochs of ", steps_per_epoch, " steps: a training set "
              "with fewer images than the checkpoint's run had (another --data-dir, a dataset packed again)?");
}

}  // namespace hpc::train

#include "train/options.hpp"

#include <boost/program_options.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "core/device.hpp"
#include "core/duration.hpp"
#include "core/error.hpp"
#include "data/dataset.hpp"
#include "nn/gemm.hpp"
#include "nn/model.hpp"
#include "optim/schedule.hpp"

namespace hpc::train {
namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace {

std::vector<double> parse_list(const std::string& s, const char* option) {
  std::vector<double> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      double v = std::stod(item, &used);
      HPC_REQUIRE(used == item.size() && std::isfinite(v) && v >= 0, "");
      out.push_back(v);
    } catch (...) {
      usage_error("--", option, " takes a comma-separated list of epochs, got '", s, "'");
    }
  }
  return out;
}

// Defaults as people write them (0.1, not Boost's 0.10000000000000001).
template <class V>
std::string shown(const V& v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

void require_finite(double v, const char* option) {
  HPC_REQUIRE(std::isfinite(v), "--", option, " must be a finite number, got ", v);
}

// Sample indices are 32-bit inside (ShardedSampler), and no dataset hpctrain reads holds more
// than 2^32 samples: a billion is far above any real batch and keeps the products hpctrain
// forms (batch x ranks, epochs x steps per epoch) far from overflowing.
constexpr int64_t kMaxBatch = 1'000'000'000;
constexpr int64_t kMaxEpochs = 1'000'000;
// The watchdog counts in int64 nanoseconds: beyond 1000 h a step timeout means "never" anyway,
// and under a second it would end healthy runs whose steps take that long.
constexpr double kMinStepTimeout = 1, kMaxStepTimeout = 1000 * 3600.0;
// A bucket must hold at least one float; 1 kB also keeps the number of buckets sane.
constexpr double kMinBucketMb = 0.001, kMaxBucketMb = 4096;

std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) s += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return s;
}

// what: the option as the message names it ("--dataset"; "model", as Model itself words it).
void require_one_of(const std::string& value, const std::vector<std::string>& names, const char* what) {
  HPC_REQUIRE(std::find(names.begin(), names.end(), value) != names.end(), "unknown ", what, " '", value,
              "' (choose ", joined(names), ")");
}

void validate_counts(const TrainOptions& o) {
  require_positive(o.epochs, "epochs");
  require_batch_size(o.batch_size, "batch-size");
  require_batch_size(o.eval_batch_size, "eval-batch-size");
  for (auto [v, name] : {std::pair{o.seed, "seed"}, {o.max_steps, "max-steps"}, {o.train_samples, "train-samples"},
                         {o.test_samples, "test-samples"}, {o.global_batch_size, "global-batch-size"},
                         {o.image_size, "image-size"},
                         {o.checkpoint_every_steps, "checkpoint-every-steps"}, {o.log_every, "log-every"}})
    require_non_negative(v, name);
  HPC_REQUIRE(o.epochs <= kMaxEpochs, "--epochs must be at most ", kMaxEpochs, ", got ", o.epochs);
  if (o.global_batch_size > 0) require_batch_size(o.global_batch_size, "global-batch-size");
  require_thread_count(o.threads);
  HPC_REQUIRE(o.image_size <= 4096, "--image-size must be at most 4096 pixels, got ", o.image_size);
  HPC_REQUIRE(o.keep_checkpoints >= 1 && o.keep_checkpoints <= 1000000,
              "--keep-checkpoints must be from 1 to 1000000, got ", o.keep_checkpoints);
}

void validate_choices(const TrainOptions& o) {
  require_one_of(o.model, nn::model_names(), "model");
  require_one_of(o.dataset, data::dataset_names(), "--dataset");
  require_one_of(o.lr_schedule, optim::schedule_names(), "--lr-schedule");
  HPC_REQUIRE(o.image_size == 0 || o.image_size >= nn::smallest_image_side(o.model), "--image-size ", o.image_size,
              " is too small for --model ", o.model, " (at least ", nn::smallest_image_side(o.model), " pixels)");
  HPC_REQUIRE(o.init == "kaiming-uniform" || o.init == "kaiming-normal",
              "--init must be kaiming-uniform or kaiming-normal, got '", o.init, "'");
  HPC_REQUIRE(o.augment == "auto" || o.augment == "on" || o.augment == "off",
              "--augment must be auto, on or off, got '", o.augment, "'");
  HPC_REQUIRE(o.device == "auto" || o.device == "cpu" || o.device == "cuda",
              "--device must be auto, cpu or cuda, got '", o.device, "'");
  HPC_REQUIRE(o.precision == "fp32" || o.precision == "tf32" || o.precision == "bf16" || o.precision == "fp16",
              "--precision must be fp32, tf32, bf16 or fp16, got '", o.precision, "'");
  HPC_REQUIRE(!o.cuda_graphs || o.precision != "fp16", "--cuda-graphs does not take --precision fp16 (its dynamic "
              "loss scale changes between steps, a graph replays fixed ones); use bf16, or leave out --cuda-graphs");
}

// As optim::Sgd would refuse them (it checks again for its own callers).
void validate_optimizer(const TrainOptions& o) {
  for (auto [v, name] : {std::pair{o.lr, "lr"}, {o.momentum, "momentum"}, {o.weight_decay, "weight-decay"},
                         {o.label_smoothing, "label-smoothing"}})
    require_finite(v, name);
  HPC_REQUIRE(o.lr > 0, "--lr must be a positive number, got ", o.lr);
  HPC_REQUIRE(o.momentum >= 0 && o.momentum < 1, "--momentum must be in [0, 1), got ", o.momentum);
  HPC_REQUIRE(!o.nesterov || o.momentum > 0, "Nesterov momentum needs --momentum > 0 (or --no-nesterov)");
  HPC_REQUIRE(o.weight_decay >= 0, "--weight-decay must not be negative, got ", o.weight_decay);
  HPC_REQUIRE(o.label_smoothing >= 0 && o.label_smoothing < 1, "--label-smoothing must be in [0, 1), got ",
              o.label_smoothing);
}

// As optim::LrSchedule would refuse them, and the values that contradict --lr or --epochs.
void validate_schedule(const TrainOptions& o) {
  for (auto [v, name] : {std::pair{o.warmup_epochs, "warmup-epochs"}, {o.lr_gamma, "lr-gamma"}, {o.min_lr, "min-lr"},
                         {o.onecycle_pct_start, "onecycle-pct-start"}, {o.onecycle_div_factor, "onecycle-div-factor"},
                         {o.onecycle_final_div_factor, "onecycle-final-div-factor"},
                         {o.onecycle_base_momentum, "onecycle-base-momentum"},
                         {o.onecycle_max_momentum, "onecycle-max-momentum"}})
    require_finite(v, name);
  HPC_REQUIRE(o.warmup_epochs >= 0, "--warmup-epochs must not be negative, got ", o.warmup_epochs);
  HPC_REQUIRE(o.warmup_epochs <= static_cast<double>(o.epochs), "--warmup-epochs ", o.warmup_epochs,
              " is longer than the run (--epochs ", o.epochs, ")");
  HPC_REQUIRE(o.lr_gamma > 0, "--lr-gamma must be positive, got ", o.lr_gamma);
  HPC_REQUIRE(o.min_lr >= 0 && o.min_lr <= o.lr, "--min-lr must be in [0, --lr ", o.lr, "] (the cosine schedule "
              "falls from --lr to it), got ", o.min_lr);
  for (double e : o.lr_step_epochs)
    HPC_REQUIRE(o.lr_schedule != "step" || e < static_cast<double>(o.epochs), "--lr-step-epochs ", e,
                " is not within the run (--epochs ", o.epochs, "): the learning rate would never change there");
  HPC_REQUIRE(o.onecycle_pct_start > 0 && o.onecycle_pct_start < 1, "--onecycle-pct-start must be in (0, 1), got ",
              o.onecycle_pct_start);
  HPC_REQUIRE(o.onecycle_div_factor >= 1 && o.onecycle_final_div_factor >= 1,
              "--onecycle-div-factor and --onecycle-final-div-factor must be at least 1, got ", o.onecycle_div_factor,
              " and ", o.onecycle_final_div_factor);
  HPC_REQUIRE(o.onecycle_base_momentum >= 0 && o.onecycle_base_momentum <= o.onecycle_max_momentum &&
                  o.onecycle_max_momentum < 1,
              "one-cycle momentum needs 0 <= --onecycle-base-momentum <= --onecycle-max-momentum < 1, got ",
              o.onecycle_base_momentum, " and ", o.onecycle_max_momentum);
}

void validate_parallel(const TrainOptions& o) {
  HPC_REQUIRE(std::isfinite(o.bucket_mb) && o.bucket_mb >= kMinBucketMb && o.bucket_mb <= kMaxBucketMb,
              "--bucket-mb must be a size in MB from ", kMinBucketMb, " (1 kB) to ", kMaxBucketMb, ", got ",
              o.bucket_mb);
  HPC_REQUIRE(o.step_timeout_seconds == 0 ||
                  (o.step_timeout_seconds >= kMinStepTimeout && o.step_timeout_seconds <= kMaxStepTimeout),
              "--step-timeout must be 0 (never) or from 1s to 1000h, got ", show_duration(o.step_timeout_seconds));
}

// A config file is a few lines: reading stops past this, so that --config /dev/zero, or a
// dataset named by mistake, ends in an error rather than taking all the memory.
constexpr size_t kMaxConfigBytes = 1 << 20;

// The text of a config file, without a UTF-8 byte-order mark (Windows editors write one).
std::string read_config_text(const std::string& path) {
  require_not_empty(path, "config");
  std::error_code ec;
  HPC_REQUIRE(!fs::is_directory(path, ec), "--config ", path, " is a directory, not a file of name = value lines");
  std::ifstream in(path, std::ios::binary);
  HPC_REQUIRE(in, "cannot read config file ", path, ": ", std::strerror(errno));
  std::string text(kMaxConfigBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  HPC_REQUIRE(!in.bad(), "cannot read config file ", path, ": ", std::strerror(errno));
  text.resize(static_cast<size_t>(in.gcount()));
  HPC_REQUIRE(text.size() <= kMaxConfigBytes, "config file ", path, " is larger than ", kMaxConfigBytes >> 20,
              " MB: not a config file of name = value lines?");
  if (text.rfind("\xEF\xBB\xBF", 0) == 0) text.erase(0, 3);
  // Control characters other than tabs and line ends mean a binary file, whose bytes would
  // otherwise reach the error line raw.
  const auto bad = std::find_if(text.begin(), text.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return (u < 0x20 && c != '\t' && c != '\n' && c != '\r') || u == 0x7f;
  });
  HPC_REQUIRE(bad == text.end(), "config file ", path, " is not a text file (byte ", bad - text.begin(),
              " is a control character): it should hold name = value lines");
  return text;
}

// Reads --config PATH into vm after the command line (whose values win). Boost's messages
// are prefixed with the file; the options that only make sense on a command line are refused.
void store_config_file(const std::string& path, const po::options_description& all, po::variables_map& vm) {
  std::istringstream in(read_config_text(path));
  try {
    const po::parsed_options parsed = po::parse_config_file(in, all);
    for (const po::option& opt : parsed.options) {
      HPC_REQUIRE(opt.string_key != "config" && opt.string_key != "help" && opt.string_key != "version",
                  "config file ", path, " sets '", opt.string_key, "', which only the command line can give");
      // "checkpoint-dir =": a generated file whose variable was unset.
      HPC_REQUIRE(opt.value.empty() || !opt.value.front().empty(), "config file ", path, ": '", opt.string_key,
                  "' is empty (an unset variable?)");
    }
    po::store(parsed, vm);
    po::notify(vm);
  } catch (const po::unknown_option& e) {
    const bool dotted = e.get_option_name().find('.') != std::string::npos;
    usage_error("config file ", path, ": ", e.what(),
                dotted ? " (sections such as [train] are not read: write name = value lines)" : "");
  } catch (const po::error& e) {
    usage_error("config file ", path, ": ", e.what());
  }
}

bool given(const po::variables_map& vm, const char* name) { return vm.count(name) && !vm[name].defaulted(); }

// Paths: an empty one is an unset variable ("--checkpoint-dir $DIR"), never a request for the
// default; and the files hpctrain writes must not be one another.
void validate_paths(const TrainOptions& o, const po::variables_map& vm) {
  for (const char* name : {"data-dir", "metrics-file", "timeline-file", "checkpoint-dir", "resume"})
    if (vm.count(name)) require_not_empty(vm[name].as<std::string>(), name);
  std::error_code ec;
  HPC_REQUIRE(o.metrics_file.empty() || o.timeline_file.empty() ||
                  (o.metrics_file != o.timeline_file && !fs::equivalent(o.metrics_file, o.timeline_file, ec)),
              "--metrics-file and --timeline-file are the same file, ", o.metrics_file,
              ": their lines would mix; give the timeline a file of its own");
}

// Checkpoint settings without a directory to write to would silently save nothing.
void validate_checkpointing(const TrainOptions& o, const po::variables_map& vm) {
  if (!o.checkpoint_dir.empty()) return;
  const std::pair<bool, const char*> asks[] = {
      {o.checkpoint_every_steps > 0, "--checkpoint-every-steps"},
      {o.checkpoint_each_epoch, "--checkpoint-each-epoch"},
      {given(vm, "keep-checkpoints"), "--keep-checkpoints"},
      {given(vm, "checkpoint-interval") && o.checkpoint_interval_seconds > 0, "--checkpoint-interval"}};
  for (const auto& [asked, option] : asks)
    HPC_REQUIRE(!asked, option, " needs --checkpoint-dir: without it no checkpoint is written");
}

}  // namespace

void require_positive(int64_t v, const char* option) {
  HPC_REQUIRE(v > 0, "--", option, " must be a positive integer, got ", v);
}

void require_non_negative(int64_t v, const char* option) {
  HPC_REQUIRE(v >= 0, "--", option, " must not be negative, got ", v);
}

void require_batch_size(int64_t v, const char* option) {
  require_positive(v, option);
  HPC_REQUIRE(v <= kMaxBatch, "--", option, " must be at most ", kMaxBatch, " samples, got ", v);
}

void require_not_empty(const std::string& value, const char* option) {
  HPC_REQUIRE(!value.empty(), "--", option, " is empty (an unset variable?)");
}

void require_thread_count(int threads) {
  HPC_REQUIRE(threads >= 0 && threads <= 4096, "--threads must be between 0 (all cores) and 4096, got ", threads);
}

std::optional<TrainOptions> parse_options(int argc, const char* const* argv, bool speak) {
  TrainOptions o;
  std::string config, step_epochs;
  bool no_nesterov = false, no_batch_norm = false, keep_last = false, no_cycle_momentum = false, no_overlap = false,
       no_deterministic = false;
  po::options_description general("General");
  general.add_options()
      ("help,h", "print this help and exit")
      ("version", "print the version and exit")
      ("config", po::value(&config), "read options from FILE (name = value lines with the long options' names, "
                                     "# comments; a text file of at most 1 MB); the command line wins")
      ("quiet", po::bool_switch(&o.quiet), "print nothing but errors")
      ("metrics-file", po::value(&o.metrics_file),
       "append JSON Lines metrics (epoch and done events) to FILE (one that exists must hold JSON Lines)")
      ("log-every", po::value(&o.log_every)->default_value(o.log_every, shown(o.log_every)),
       "steps between progress lines when not on a terminal (0: about ten per epoch)")
      ("seed", po::value(&o.seed)->default_value(o.seed, shown(o.seed)), "seed of initialisation, shuffling and augmentation")
      ("threads", po::value(&o.threads)->default_value(o.threads, shown(o.threads)),
       "math-library threads per rank (0: the host's cores / the ranks on it)")
      ("device", po::value(&o.device)->default_value(o.device, shown(o.device)),
       "auto (the GPU of each rank's local rank when one is visible, else the CPU), cpu or cuda")
      ("precision", po::value(&o.precision)->default_value(o.precision, shown(o.precision)),
       "GPU arithmetic: tf32 (convolutions and matrix products on tensor cores, as PyTorch's cuDNN default), "
       "fp32 (IEEE float throughout), or mixed precision as PyTorch's autocast: bf16, or fp16 with dynamic loss "
       "scaling (activations in 16 bits; master weights, gradients and optimizer state in fp32); the CPU always "
       "computes in fp32 (and refuses bf16 and fp16)")
      ("cuda-graphs", po::bool_switch(&o.cuda_graphs),
       "GPU, one rank per job: capture the training step once its shapes are steady and replay it as one CUDA "
       "graph (one launch instead of hundreds: small models on big GPUs are launch-bound); the same bits as "
       "without; not with --precision fp16, whose loss scale changes between steps")
      ("no-deterministic", po::bool_switch(&no_deterministic),
       "GPU: let cuDNN choose non-deterministic algorithms too (faster for some shapes; runs then differ in their "
       "last bits and a resume is no longer bit-exact)");
  po::options_description model("Model and data");
  model.add_options()
      ("model", po::value(&o.model)->default_value(o.model, shown(o.model)), "mlp, cnn, resnet20, resnet18 or resnet50")
      ("no-batch-norm", po::bool_switch(&no_batch_norm), "the model's variant without batch norm")
      ("init", po::value(&o.init)->default_value(o.init, shown(o.init)),
       "how weights start: kaiming-uniform (PyTorch's default for conv and linear layers, "
       "U(+-1/sqrt(fan_in)), as the peer) or kaiming-normal (N(0, 2/fan_in), the ReLU gain); biases start at 0")
      ("dataset", po::value(&o.dataset)->default_value(o.dataset, shown(o.dataset)), "fashion-mnist, mnist, cifar10, cifar100, shards (an image folder packed by hpcdata pack) or synthetic (2048 random 224x224 images and 1000 classes from a fixed seed, for benchmarks)")
      ("data-dir", po::value(&o.data_dir), "directory of the dataset files (default: where Debian's "
                                           "dataset-fashion-mnist installs them)")
      ("image-size", po::value(&o.image_size)->default_value(o.image_size, shown(o.image_size)),
       "shards: side of the square images the model sees (random resized crops in training, centre crops "
       "in evaluation; 0: 224); synthetic: the images' side (0: 224)")
      ("train-samples", po::value(&o.train_samples)->default_value(o.train_samples, shown(o.train_samples)),
       "use only the first N training samples (0: all)")
      ("test-samples", po::value(&o.test_samples)->default_value(o.test_samples, shown(o.test_samples)),
       "evaluate on the first N test samples only (0: all)")
      ("augment", po::value(&o.augment)->default_value(o.augment, shown(o.augment)),
       "auto (random crop + flip for cifar10 and cifar100, random resized crop + flip for shards), on or off");
  po::options_description training("Training");
  training.add_options()
      ("epochs", po::value(&o.epochs)->default_value(o.epochs, shown(o.epochs)), "passes over the training set")
      ("max-steps", po::value(&o.max_steps)->default_value(o.max_steps, shown(o.max_steps)), "stop after N steps in all (0: no limit)")
      ("batch-size", po::value(&o.batch_size)->default_value(o.batch_size, shown(o.batch_size)),
       "samples per step on each rank")
      ("global-batch-size", po::value(&o.global_batch_size)->default_value(o.global_batch_size, shown(o.global_batch_size)),
       "samples per step over all ranks, instead of --batch-size (0: batch-size x ranks)")
      ("keep-last-batch", po::bool_switch(&keep_last), "train on the short last batch of each epoch "
                                                       "instead of dropping it")
      ("eval-batch-size", po::value(&o.eval_batch_size)->default_value(o.eval_batch_size, shown(o.eval_batch_size)),
       "samples per evaluation batch")
      ("lr", po::value(&o.lr)->default_value(o.lr, shown(o.lr)), "learning rate (the peak for onecycle)")
      ("lr-schedule", po::value(&o.lr_schedule)->default_value(o.lr_schedule, shown(o.lr_schedule)), "constant, step, cosine or onecycle")
      ("warmup-epochs", po::value(&o.warmup_epochs)->default_value(o.warmup_epochs, shown(o.warmup_epochs)),
       "linear warm-up from 0 over this many epochs (fractions allowed; at most --epochs)")
      ("lr-step-epochs", po::value(&step_epochs), "step: epochs at which the lr is multiplied by --lr-gamma, "
                                                  "e.g. 30,60 (each before --epochs)")
      ("lr-gamma", po::value(&o.lr_gamma)->default_value(o.lr_gamma, shown(o.lr_gamma)), "step: factor at each step")
      ("min-lr", po::value(&o.min_lr)->default_value(o.min_lr, shown(o.min_lr)), "cosine: final learning rate (0 to --lr)")
      ("onecycle-pct-start", po::value(&o.onecycle_pct_start)->default_value(o.onecycle_pct_start, shown(o.onecycle_pct_start)),
       "onecycle: fraction of the run spent rising")
      ("onecycle-div-factor", po::value(&o.onecycle_div_factor)->default_value(o.onecycle_div_factor, shown(o.onecycle_div_factor)),
       "onecycle: initial lr = lr / this")
      ("onecycle-final-div-factor",
       po::value(&o.onecycle_final_div_factor)->default_value(o.onecycle_final_div_factor, shown(o.onecycle_final_div_factor)),
       "onecycle: final lr = initial lr / this")
      ("onecycle-base-momentum", po::value(&o.onecycle_base_momentum)->default_value(o.onecycle_base_momentum, shown(o.onecycle_base_momentum)),
       "onecycle: momentum at the lr peak")
      ("onecycle-max-momentum", po::value(&o.onecycle_max_momentum)->default_value(o.onecycle_max_momentum, shown(o.onecycle_max_momentum)),
       "onecycle: momentum at the start and end")
      ("no-cycle-momentum", po::bool_switch(&no_cycle_momentum),
       "onecycle: keep --momentum fixed instead of cycling it (PyTorch's cycle_momentum=False)")
      ("momentum", po::value(&o.momentum)->default_value(o.momentum, shown(o.momentum)),
       "SGD momentum (under onecycle only with --no-cycle-momentum)")
      ("no-nesterov", po::bool_switch(&no_nesterov), "classical momentum instead of Nesterov")
      ("weight-decay", po::value(&o.weight_decay)->default_value(o.weight_decay, shown(o.weight_decay)), "L2 weight decay")
      ("decay-bias-and-norm", po::bool_switch(&o.decay_bias_and_norm),
       "apply weight decay to biases and batch-norm parameters too")
      ("label-smoothing", po::value(&o.label_smoothing)->default_value(o.label_smoothing, shown(o.label_smoothing)),
       "label smoothing of the cross-entropy target");
  po::options_description parallel("Data parallelism (mpirun -np N hpctrain ...)");
  parallel.add_options()
      ("bucket-mb", po::value(&o.bucket_mb)->default_value(o.bucket_mb, shown(o.bucket_mb)),
       "size of the gradient all-reduce buckets, in MB, 0.001 to 4096 (the first, of the last layers, at most 1 MB)")
      ("no-overlap", po::bool_switch(&no_overlap),
       "all-reduce the gradients after the backward pass instead of during it (to measure the overlap)")
      ("sync-batch-norm", po::bool_switch(&o.sync_batch_norm),
       "batch-norm statistics over the whole global batch (all ranks) instead of each rank's part")
      ("timeline-file", po::value(&o.timeline_file),
       "append, for every step, when each gradient bucket was queued and all-reduced (JSON Lines, rank 0)");
  std::string interval = "10m", step_timeout = "10m";
  po::options_description checkpoints("Checkpoints, resume and failures");
  checkpoints.add_options()
      ("checkpoint-dir", po::value(&o.checkpoint_dir),
       "rank 0 writes checkpoints here (shared storage on clusters); none without it (the options below that ask "
       "for checkpoints then are refused)")
      ("keep-checkpoints", po::value(&o.keep_checkpoints)->default_value(o.keep_checkpoints, shown(o.keep_checkpoints)),
       "keep the newest K checkpoints (1 to 1000000)")
      ("checkpoint-every-steps",
       po::value(&o.checkpoint_every_steps)->default_value(o.checkpoint_every_steps, shown(o.checkpoint_every_steps)),
       "also checkpoint every N steps (0: not by steps)")
      ("checkpoint-interval", po::value(&interval)->default_value(interval),
       "checkpoint when this much wall-clock time has passed since the last one: 90s, 10m, 1.5h (0: never)")
      ("checkpoint-each-epoch", po::bool_switch(&o.checkpoint_each_epoch), "also checkpoint after every epoch")
      ("resume", po::value(&o.resume)->default_value(o.resume),
       "auto (the newest valid checkpoint in --checkpoint-dir, else a fresh start), none, or a checkpoint file")
      ("step-timeout", po::value(&step_timeout)->default_value(step_timeout),
       "end the job (exit code 124) when no step finishes for this long, as when a peer hangs or died inside an "
       "all-reduce: 90s, 10m (0: never; else 1s to 1000h)");
  po::options_description all("Usage: hpctrain [train] [options]\n"
                              "       hpctrain evaluate --checkpoint PATH [options]   (test accuracy of a checkpoint)\n"
                              "       hpctrain inspect PATH [--json]                  (what a checkpoint holds)\n"
                              "       hpctrain export --checkpoint PATH --output FILE (the model as an ONNX file)\n"
                              "       hpctrain predict --checkpoint PATH IMAGES...   (classify PNG and JPEG images)\n"
                              "Trains a model; with no options, the default job (cnn on Fashion-MNIST, 3 epochs). "
                              "Run under mpirun for data parallelism");
  all.add(general).add(model).add(training).add(parallel).add(checkpoints);

  po::variables_map vm;
  try {
    // No positional options: a stray word ("hpctrain resnet20") is an error, not ignored.
    po::store(po::command_line_parser(argc, argv).options(all).positional({}).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    usage_error(e.what());
  }
  // Stored after the command line, so options given there win.
  if (vm.count("config")) store_config_file(vm["config"].as<std::string>(), all, vm);
  if (vm.count("help")) {
    if (speak) std::cout << all << "\n";
    return std::nullopt;
  }
  if (vm.count("version")) {
    if (speak) std::cout << "hpctrain " << HPCTRAIN_VERSION << " (CPU GEMM: " << nn::gemm_backend() << "; "
              << device::describe() << ")\n";
    return std::nullopt;
  }
  o.nesterov = !no_nesterov;
  o.cycle_momentum = !no_cycle_momentum;
  o.batch_norm = !no_batch_norm;
  o.drop_last = !keep_last;
  o.overlap = !no_overlap;
  o.deterministic = !no_deterministic;
  o.checkpoint_interval_seconds = parse_duration(interval, "checkpoint-interval");
  o.step_timeout_seconds = parse_duration(step_timeout, "step-timeout");
  validate_paths(o, vm);
  HPC_REQUIRE(o.global_batch_size == 0 || vm["batch-size"].defaulted(),
              "give --batch-size (per rank) or --global-batch-size (over all ranks), not both");
  if (vm.count("lr-step-epochs")) require_not_empty(step_epochs, "lr-step-epochs");
  if (!step_epochs.empty()) o.lr_step_epochs = parse_list(step_epochs, "lr-step-epochs");
  HPC_REQUIRE(o.lr_schedule != "step" || !o.lr_step_epochs.empty(),
              "--lr-schedule step needs --lr-step-epochs (e.g. 30,60)");
  validate_counts(o);
  validate_choices(o);
  validate_optimizer(o);
  validate_schedule(o);
  validate_parallel(o);
  validate_checkpointing(o, vm);
  return o;
}

std::vector<std::pair<std::string, std::string>> option_values(const TrainOptions& o) {
  std::vector<std::pair<std::string, std::string>> v;
  auto add = [&](const char* name, const auto& value) {
    std::ostringstream os;
    os << value;
    v.emplace_back(name, os.str());
  };
  add("model", o.model), add("no-batch-norm", !o.batch_norm), add("init", o.init), add("dataset", o.dataset);
  add("train-samples", o.train_samples), add("test-samples", o.test_samples), add("augment", o.augment);
  add("image-size", o.image_size);
  add("epochs", o.epochs), add("max-steps", o.max_steps), add("batch-size", o.batch_size);
  add("global-batch-size", o.global_batch_size), add("keep-last-batch", !o.drop_last);
  add("eval-batch-size", o.eval_batch_size), add("lr", o.lr), add("momentum", o.momentum);
  add("weight-decay", o.weight_decay), add("label-smoothing", o.label_smoothing), add("no-nesterov", !o.nesterov);
  add("decay-bias-and-norm", o.decay_bias_and_norm), add("lr-schedule", o.lr_schedule);
  add("warmup-epochs", o.warmup_epochs), add("lr-gamma", o.lr_gamma), add("min-lr", o.min_lr);
  std::ostringstream steps;
  for (double e : o.lr_step_epochs) steps << e << ',';
  add("lr-step-epochs", steps.str()), add("onecycle-pct-start", o.onecycle_pct_start);
  add("onecycle-div-factor", o.onecycle_div_factor), add("onecycle-final-div-factor", o.onecycle_final_div_factor);
  add("no-cycle-momentum", !o.cycle_momentum), add("onecycle-base-momentum", o.onecycle_base_momentum);
  add("onecycle-max-momentum", o.onecycle_max_momentum), add("seed", o.seed), add("device", o.device);
  add("precision", o.precision), add("no-deterministic", !o.deterministic), add("cuda-graphs", o.cuda_graphs);
  add("bucket-mb", o.bucket_mb), add("no-overlap", !o.overlap), add("sync-batch-norm", o.sync_batch_norm);
  return v;
}

}  // namespace hpc::train

#include "train/options.hpp"

#include <boost/program_options.hpp>
#include <cmath>
#include <fstream>
#include <iostream>
#include <sstream>

#include "core/device.hpp"
#include "core/duration.hpp"
#include "core/error.hpp"
#include "nn/gemm.hpp"

namespace hpc::train {
namespace po = boost::program_options;

namespace {

std::vector<double> parse_list(const std::string& s, const char* option) {
  std::vector<double> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      double v = std::stod(item, &used);
      HPC_REQUIRE(used == item.size() && v >= 0, "");
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

void validate(const TrainOptions& o) {
  require_positive(o.epochs, "epochs");
  require_positive(o.batch_size, "batch-size");
  require_positive(o.eval_batch_size, "eval-batch-size");
  for (auto [v, name] : {std::pair{o.seed, "seed"}, {o.max_steps, "max-steps"}, {o.train_samples, "train-samples"},
                         {o.test_samples, "test-samples"}, {o.global_batch_size, "global-batch-size"},
                         {o.image_size, "image-size"},
                         {o.checkpoint_every_steps, "checkpoint-every-steps"}, {o.log_every, "log-every"}})
    require_non_negative(v, name);
  require_thread_count(o.threads);
  HPC_REQUIRE(o.image_size <= 4096, "--image-size must be at most 4096 pixels, got ", o.image_size);
  HPC_REQUIRE(std::isfinite(o.bucket_mb) && o.bucket_mb > 0 && o.bucket_mb <= 4096,
              "--bucket-mb must be a size in MB in (0, 4096], got ", o.bucket_mb);
  HPC_REQUIRE(o.keep_checkpoints >= 1 && o.keep_checkpoints <= 1000000,
              "--keep-checkpoints must be at least 1, got ", o.keep_checkpoints);
  for (auto [v, name] : {std::pair{o.lr, "lr"}, {o.momentum, "momentum"}, {o.weight_decay, "weight-decay"},
                         {o.label_smoothing, "label-smoothing"}, {o.warmup_epochs, "warmup-epochs"},
                         {o.lr_gamma, "lr-gamma"}, {o.min_lr, "min-lr"}})
    require_finite(v, name);
  HPC_REQUIRE(o.label_smoothing >= 0 && o.label_smoothing < 1, "--label-smoothing must be in [0, 1), got ",
              o.label_smoothing);
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

}  // namespace

void require_positive(int64_t v, const char* option) {
  HPC_REQUIRE(v > 0, "--", option, " must be a positive integer, got ", v);
}

void require_non_negative(int64_t v, const char* option) {
  HPC_REQUIRE(v >= 0, "--", option, " must not be negative, got ", v);
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
      ("config", po::value(&config), "read options from FILE (key = value, same names as the long "
                                     "options); the command line wins")
      ("quiet", po::bool_switch(&o.quiet), "print nothing but errors")
      ("metrics-file", po::value(&o.metrics_file), "append JSON Lines metrics (epoch and done events) to FILE")
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
       "linear warm-up from 0 over this many epochs (fractions allowed)")
      ("lr-step-epochs", po::value(&step_epochs), "step: epochs at which the lr is multiplied by --lr-gamma, "
                                                  "e.g. 30,60")
      ("lr-gamma", po::value(&o.lr_gamma)->default_value(o.lr_gamma, shown(o.lr_gamma)), "step: factor at each step")
      ("min-lr", po::value(&o.min_lr)->default_value(o.min_lr, shown(o.min_lr)), "cosine: final learning rate")
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
       "size of the gradient all-reduce buckets, in MB (the first, of the last layers, at most 1 MB)")
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
       "rank 0 writes checkpoints here (shared storage on clusters); none without it")
      ("keep-checkpoints", po::value(&o.keep_checkpoints)->default_value(o.keep_checkpoints, shown(o.keep_checkpoints)),
       "keep the newest K checkpoints")
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
       "all-reduce: 90s, 10m (0: never)");
  po::options_description all("Usage: hpctrain [train] [options]\n"
                              "       hpctrain evaluate --checkpoint PATH [options]   (test accuracy of a checkpoint)\n"
                              "       hpctrain inspect PATH [--json]                  (what a checkpoint holds)\n"
                              "Trains a model; with no options, the default job (cnn on Fashion-MNIST, 3 epochs). "
                              "Run under mpirun for data parallelism");
  all.add(general).add(model).add(training).add(parallel).add(checkpoints);

  po::variables_map vm;
  try {
    // No positional options: a stray word ("hpctrain resnet20") is an error, not ignored.
    po::store(po::command_line_parser(argc, argv).options(all).positional({}).run(), vm);
    if (vm.count("config")) {
      const std::string path = vm["config"].as<std::string>();
      std::ifstream in(path);
      HPC_REQUIRE(in.good(), "cannot read config file ", path);
      // Stored after the command line, so options given there win.
      po::store(po::parse_config_file(in, all), vm);
    }
    po::notify(vm);
  } catch (const po::error& e) {
    usage_error(e.what());
  }
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
  HPC_REQUIRE(!o.resume.empty(), "--resume must be auto, none or a checkpoint file");
  HPC_REQUIRE(o.global_batch_size == 0 || vm["batch-size"].defaulted(),
              "give --batch-size (per rank) or --global-batch-size (over all ranks), not both");
  if (!step_epochs.empty()) o.lr_step_epochs = parse_list(step_epochs, "lr-step-epochs");
  HPC_REQUIRE(o.lr_schedule != "step" || !o.lr_step_epochs.empty(),
              "--lr-schedule step needs --lr-step-epochs (e.g. 30,60)");
  validate(o);
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

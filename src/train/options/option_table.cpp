// The option table. To add an option: a member in TrainOptions (with its default), one entry
// here with its Rule, and a line in tests/unit/options_test.cpp's list (which checks that --help,
// the agreement check and the resume check all know it).
#include "train/options/option_table.hpp"

#include <cmath>
#include <functional>
#include <sstream>

#include "core/duration.hpp"
#include "core/option_kit.hpp"
#include "core/error.hpp"
#include "train/options/option_checks.hpp"
#include "train/options/subcommand.hpp"  // --threads, as evaluate and predict word it
#include "train/stop/signals.hpp"

namespace hpc::train {
namespace po = boost::program_options;

namespace {

using Members = TrainOptions;

using options::bool_from_text;
using options::text;
using Entry = options::Entry<TrainOptions>;

Option with(Rule rule, Entry e) { return {std::move(e), rule}; }

// The kinds of option every command line has (core/option_kit.hpp), each with its rule here.
template <class T>
Option number(const char* name, T Members::*m, Rule rule, std::string help) {
  return with(rule, options::number(name, m, std::move(help)));
}

// A path or file name (or a size); none by default, and given blank it is refused: an unset
// variable ("--checkpoint-dir $DIR"), never a request for the default.
Option path(const char* name, std::string Members::*m, Rule rule, std::string help) {
  return with(rule, options::path(name, m, std::move(help), options::Presence::NotBlank));
}

Option flag(const char* name, bool Members::*m, Rule rule, std::string help) {
  return with(rule, options::flag(name, m, std::move(help)));
}

Option negation(const char* name, bool Members::*m, Rule rule, std::string help) {
  return with(rule, options::negation(name, m, std::move(help)));
}

template <class E, size_t N>
Option choice(const char* name, E Members::*m, const Named<E> (&names)[N], Rule rule, std::string help,
              std::string what = "") {
  return with(rule, options::choice(name, m, names, std::move(help), std::move(what)));
}

Option duration(const char* name, double Members::*m, Rule rule, std::string help) {
  return with(rule, options::duration(name, m, std::move(help)));
}

// One setting given by two switches, --NAME and --no-NAME (help, no_help), added and read
// together: `set` makes the member from which of them was given; both at once is refused.
Option switch_pair(const char* name, Rule rule, std::string help, std::string no_help,
                   std::function<void(bool on, bool off, TrainOptions& o)> set,
                   std::function<std::string(const TrainOptions& o)> value,
                   std::function<void(const std::string& text, TrainOptions& o)> parse) {
  const std::string no = std::string("no-") + name;
  return with(rule, {name,
                     [=](po::options_description& d, TrainOptions&) {
                       d.add_options()(name, po::bool_switch(), help.c_str())(no.c_str(), po::bool_switch(),
                                                                              no_help.c_str());
                     },
                     [=](const po::variables_map& vm, TrainOptions& o) {
                       const bool on = vm[name].as<bool>(), off = vm[no].as<bool>();
                       HPC_REQUIRE(!(on && off), "--", name, " and --", no, " contradict each other: give one");
                       set(on, off, o);
                     },
                     std::move(value), std::move(parse)});
}

// A setting on by default: --NAME, kept for the scripts written while it was off by default,
// changes nothing; --no-NAME (help: no_help) clears it. Recorded under NAME, as before.
Option on_by_default(const char* name, bool Members::*m, Rule rule, std::string help, std::string no_help) {
  return switch_pair(
      name, rule, help + " (the default)", std::move(no_help), [m](bool, bool off, TrainOptions& o) { o.*m = !off; },
      [m](const TrainOptions& o) { return text(o.*m); },
      [=](const std::string& t, TrainOptions& o) { o.*m = bool_from_text(t, name); });
}

// A setting chosen where it applies unless asked for: --NAME asks for it (an error where it cannot
// apply), --no-NAME turns it off, neither leaves it to the run (auto). Recorded under NAME as
// auto, on or off (1 and 0, as checkpoints recorded --cuda-graphs while it was a flag, read back
// as on and auto).
Option on_where_it_applies(const char* name, CudaGraphs Members::*m, Rule rule, std::string help, std::string no_help) {
  return switch_pair(
      name, rule, std::move(help), std::move(no_help),
      [m](bool on, bool off, TrainOptions& o) { o.*m = on ? CudaGraphs::On : off ? CudaGraphs::Off : CudaGraphs::Auto; },
      [m](const TrainOptions& o) { return std::string(name_of(kCudaGraphsNames, o.*m)); },
      [=](const std::string& t, TrainOptions& o) {
        o.*m = t == "1"   ? CudaGraphs::On
               : t == "0" ? CudaGraphs::Auto
                          : parse_named(kCudaGraphsNames, t, std::string("--") + name);
      });
}

std::vector<double> parse_epochs(const std::string& s, const char* option) {
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

// Comma-separated epochs ("30,60"); none by default.
Option epoch_list(const char* name, std::vector<double> Members::*m, Rule rule, std::string help) {
  return with(rule, {name,
          [=](po::options_description& d, TrainOptions&) { d.add_options()(name, po::value<std::string>(), help.c_str()); },
          [=](const po::variables_map& vm, TrainOptions& o) {
            if (!vm.count(name)) return;
            const std::string& given = vm[name].as<std::string>();
            options::refuse_blank(given, std::string("--") + name);
            o.*m = parse_epochs(given, name);
          },
          [m](const TrainOptions& o) {
            std::ostringstream os;
            for (double e : o.*m) os << e << ',';
            return os.str();
          },
          [=](const std::string& t, TrainOptions& o) {
            (o.*m).clear();
            if (!t.empty()) o.*m = parse_epochs(t.back() == ',' ? t.substr(0, t.size() - 1) : t, name);
          }});
}

void read_resume(const std::string& v, TrainOptions& o) {
  o.resume = v == "auto" ? ResumeFrom::Auto : v == "none" ? ResumeFrom::None : ResumeFrom::File;
  o.resume_file = o.resume == ResumeFrom::File ? v : "";
}

// --resume: auto, none or a file.
Option resume(Rule rule, std::string help) {
  return with(rule, {"resume",
          [=](po::options_description& d, TrainOptions&) {
            d.add_options()("resume", po::value<std::string>()->default_value("auto"), help.c_str());
          },
          [](const po::variables_map& vm, TrainOptions& o) {
            const std::string& given = vm["resume"].as<std::string>();
            options::refuse_blank(given, "--resume");
            read_resume(given, o);
          },
          [](const TrainOptions& o) {
            return o.resume == ResumeFrom::Auto ? std::string("auto") : o.resume == ResumeFrom::None ? "none" : o.resume_file;
          },
          read_resume});
}

int64_t steps_or_auto_of(const std::string& v, const char* name) {
  if (v == "auto") return -1;
  size_t used = 0;
  long long n = -1;
  try {
    n = std::stoll(v, &used);
  } catch (...) {
    used = 0;
  }
  HPC_REQUIRE(used > 0 && used == v.size() && n >= 0, "--", name, " takes auto or a number of steps (0: off), got '",
              v, "'");
  return n;
}

// --snapshot-every-steps: auto (-1) or a count.
Option steps_or_auto(const char* name, int64_t Members::*m, Rule rule, std::string help) {
  return with(rule, {name,
          [=](po::options_description& d, TrainOptions&) {
            d.add_options()(name, po::value<std::string>()->default_value("auto"), help.c_str());
          },
          [=](const po::variables_map& vm, TrainOptions& o) {
            const std::string& given = vm[name].as<std::string>();
            options::refuse_blank(given, std::string("--") + name);
            o.*m = steps_or_auto_of(given, name);
          },
          [m](const TrainOptions& o) { return o.*m < 0 ? std::string("auto") : text(o.*m); },
          [=](const std::string& t, TrainOptions& o) { o.*m = steps_or_auto_of(t, name); }});
}

// --stop-signals: signal names, comma-separated (signals.hpp).
Option stop_signals(Rule rule, std::string help) {
  return with(rule, {"stop-signals",
          [=](po::options_description& d, TrainOptions& o) {
            d.add_options()("stop-signals", po::value<std::string>()->default_value(stop_signals_text(o.stop_signals)),
                            help.c_str());
          },
          [](const po::variables_map& vm, TrainOptions& o) {
            o.stop_signals = parse_stop_signals(vm["stop-signals"].as<std::string>());
          },
          [](const TrainOptions& o) { return stop_signals_text(o.stop_signals); },
          [](const std::string& t, TrainOptions& o) { o.stop_signals = parse_stop_signals(t); }});
}

std::vector<Option> general() {
  using R = Rule;
  return {
      flag("quiet", &Members::quiet, R::Local, "print nothing but errors"),
      path("metrics-file", &Members::metrics_file, R::Local,
           "append JSON Lines metrics (epoch and done events) to FILE (one that exists must hold JSON Lines)"),
      number("metrics-every-steps", &Members::metrics_every_steps, R::Local,
             "with --metrics-file: also a step event (loss, learning rate, throughput, data and communication "
             "waits of one step) every N steps (0: none)"),
      path("prometheus-file", &Members::prometheus_file, R::Local,
           "keep the latest step's figures and the run's state in FILE (*.prom) for node_exporter's textfile "
           "collector: rewritten whole about once a second, after each epoch and at the end (rank 0)"),
      choice("progress", &Members::progress, kProgressNames, R::Local,
             "auto (a line redrawn in place when stdout is an interactive terminal: not a file, not TERM=dumb, not "
             "a pseudo-terminal of mpirun, srun or hpcrun; else lines), bar, lines (plain log lines) or off"),
      number("log-every", &Members::log_every, R::Local,
             "progress lines: one every N steps (0: one every --progress-interval, and at each epoch's end)"),
      duration("progress-interval", &Members::progress_interval_seconds, R::Local,
               "progress lines: time between them when --log-every is 0: 30s, 5m"),
      choice("log-level", &Members::log_level, kLogLevelNames, R::Local,
             "error, warn, info or debug: the least important lines printed (--quiet: warn)"),
      choice("log-timestamps", &Members::log_timestamps, kStampNames, R::Local,
             "start log lines with the UTC time (2026-01-31T12:00:00.123Z): auto (stdout's lines when it is not an "
             "interactive terminal), on (every line, warnings and errors too) or off"),
      number("seed", &Members::seed, R::Match, "seed of initialisation, shuffling and augmentation"),
      with(R::Local, subcommand_options::threads(&Members::threads, "math-library threads")),
      choice("device", &Members::device, kDeviceNames, R::Agree,
             "auto (the GPU of each rank's local rank when one is visible, else the CPU), cpu or cuda"),
      choice("precision", &Members::precision, kPrecisionNames, R::Agree,
             "GPU arithmetic: tf32 (convolutions and matrix products on tensor cores, as PyTorch's cuDNN default), "
             "fp32 (IEEE float throughout), or mixed precision as PyTorch's autocast: bf16, or fp16 with dynamic "
             "loss scaling (activations in 16 bits; master weights, gradients and optimizer state in fp32); the CPU "
             "always computes in fp32 (and refuses bf16 and fp16)"),
      on_where_it_applies("cuda-graphs", &Members::cuda_graphs, R::Agree,
                          "GPU: capture the training step once its shapes are steady and replay it as one CUDA "
                          "graph (one launch instead of hundreds: small models on big GPUs are launch-bound); the "
                          "same bits as without. The default for one rank training on its GPU; given, also with "
                          "several ranks (their NCCL all-reduces captured in the graph), and an error on the CPU",
                          "GPU: launch every kernel of every step from the host (the eager steps), also where "
                          "graphs would apply"),
      choice("jpeg-decode", &Members::jpeg_decode, kJpegDecodeNames, R::Agree,
             "packed JPEG shards: where their images are decoded, cropped, flipped and normalised: auto (on the GPU "
             "with nvJPEG, libnvjpeg.so.13, when training on a GPU and the library loads; else on the CPU, saying "
             "why on a GPU), cpu (the loader's threads, libjpeg-turbo) or gpu (an error where it cannot)"),
      negation("no-deterministic", &Members::deterministic, R::Agree,
               "GPU: let cuDNN choose non-deterministic algorithms too (faster for some shapes; runs then differ in "
               "their last bits and a resume is no longer bit-exact)"),
  };
}

std::vector<Option> model_and_data() {
  using R = Rule;
  return {
      choice("model", &Members::model, nn::kModelNames, R::Match, names_of(nn::kModelNames), "model"),
      negation("no-batch-norm", &Members::batch_norm, R::Match, "the model's variant without batch norm"),
      choice("init", &Members::init, nn::kInitNames, R::Agree,
             "how weights start: kaiming-uniform (PyTorch's default for conv and linear layers, "
             "U(+-1/sqrt(fan_in)) for weights and biases, as the peer) or kaiming-normal (N(0, 2/fan_in), the ReLU "
             "gain, and biases at 0)"),
      choice("dataset", &Members::dataset, data::kDatasetNames, R::Match,
             "fashion-mnist, mnist, cifar10, cifar100, shards (an image folder packed by hpcdata pack) or synthetic "
             "(2048 random 224x224 images and 1000 classes from a fixed seed, for benchmarks)"),
      path("data-dir", &Members::data_dir, R::Local,
           "directory of the dataset files (default: where Debian's dataset-fashion-mnist installs them)"),
      number("image-size", &Members::image_size, R::Match,
             "shards: side of the square images the model sees (random resized crops in training, centre crops in "
             "evaluation; 0: 224); synthetic: the images' side (0: 224)"),
      number("train-samples", &Members::train_samples, R::Match, "use only the first N training samples (0: all; at most as many as the set holds)"),
      number("test-samples", &Members::test_samples, R::Agree, "evaluate on the first N test samples only (0: all; at most as many as the set holds)"),
      choice("augment", &Members::augment, kAugmentNames, R::Match,
             "auto (random crop + flip for cifar10 and cifar100, random resized crop + flip for shards), on or off"),
  };
}

std::vector<Option> schedule() {
  using R = Rule;
  return {
      number("lr", &Members::lr, R::Match, "learning rate (the peak for onecycle)"),
      choice("lr-schedule", &Members::lr_schedule, optim::kScheduleNames, R::Match, names_of(optim::kScheduleNames)),
      number("warmup-epochs", &Members::warmup_epochs, R::Match,
             "linear warm-up from 0 over this many epochs (fractions allowed; at most --epochs)"),
      epoch_list("lr-step-epochs", &Members::lr_step_epochs, R::Match,
                 "step: epochs at which the lr is multiplied by --lr-gamma, e.g. 30,60 (each before --epochs)"),
      number("lr-gamma", &Members::lr_gamma, R::Match, "step: factor at each step"),
      number("min-lr", &Members::min_lr, R::Match, "cosine: final learning rate (0 to --lr)"),
      number("onecycle-pct-start", &Members::onecycle_pct_start, R::Match, "onecycle: fraction of the run spent rising"),
      number("onecycle-div-factor", &Members::onecycle_div_factor, R::Match, "onecycle: initial lr = lr / this"),
      number("onecycle-final-div-factor", &Members::onecycle_final_div_factor, R::Match,
             "onecycle: final lr = initial lr / this"),
      number("onecycle-base-momentum", &Members::onecycle_base_momentum, R::Match, "onecycle: momentum at the lr peak"),
      number("onecycle-max-momentum", &Members::onecycle_max_momentum, R::Match,
             "onecycle: momentum at the start and end"),
      negation("no-cycle-momentum", &Members::cycle_momentum, R::Match,
               "onecycle: keep --momentum fixed instead of cycling it (PyTorch's cycle_momentum=False)"),
  };
}

std::vector<Option> training() {
  using R = Rule;
  std::vector<Option> t{
      number("epochs", &Members::epochs, R::Match, "passes over the training set"),
      number("max-steps", &Members::max_steps, R::Match, "stop after N steps in all (0: no limit)"),
      number("batch-size", &Members::batch_size, R::Match,
             "samples per step on each rank (a resumed run keeps the checkpoint's global batch at any world size)"),
      number("global-batch-size", &Members::global_batch_size, R::Agree,
             "samples per step over all ranks, instead of --batch-size (0: batch-size x ranks)"),
      negation("keep-last-batch", &Members::drop_last, R::Match,
               "train on the short last batch of each epoch instead of dropping it"),
      number("eval-batch-size", &Members::eval_batch_size, R::Agree, "samples per evaluation batch"),
  };
  for (Option& s : schedule()) t.push_back(std::move(s));
  for (Option& s : std::vector<Option>{
           number("momentum", &Members::momentum, R::Match, "SGD momentum (under onecycle only with --no-cycle-momentum)"),
           negation("no-nesterov", &Members::nesterov, R::Match, "classical momentum instead of Nesterov"),
           number("weight-decay", &Members::weight_decay, R::Match, "L2 weight decay"),
           on_by_default("decay-bias-and-norm", &Members::decay_bias_and_norm, R::Match,
                         "apply weight decay to biases and batch-norm parameters too, as torch.optim.SGD does",
                         "decay only the weights of convolutions and linear layers (the rule before 2026-11-25)"),
           number("label-smoothing", &Members::label_smoothing, R::Match, "label smoothing of the cross-entropy target"),
       })
    t.push_back(std::move(s));
  return t;
}

std::vector<Option> parallel() {
  using R = Rule;
  return {
      number("bucket-mb", &Members::bucket_mb, R::Agree,
             "size of the gradient all-reduce buckets, in MB, 0.001 to 4096 (the first, of the last layers, at most "
             "1 MB)"),
      negation("no-overlap", &Members::overlap, R::Agree,
               "all-reduce the gradients after the backward pass instead of during it (to measure the overlap)"),
      flag("sync-batch-norm", &Members::sync_batch_norm, R::Match,
           "batch-norm statistics over the whole global batch (all ranks) instead of each rank's part"),
      path("timeline-file", &Members::timeline_file, R::Local,
           "append every rank's steps as a Chrome trace (Perfetto, chrome://tracing): data wait, forward, "
           "backward, each gradient bucket's queue and all-reduce, optimizer, checkpoints; a name ending in .jsonl: "
           "rank 0's buckets as JSON Lines"),
  };
}

std::vector<Option> checkpoints() {
  using R = Rule;
  return {
      path("checkpoint-dir", &Members::checkpoint_dir, R::Local,
           "rank 0 writes checkpoints here (shared storage on clusters); none without it (the options below that "
           "ask for checkpoints then are refused)"),
      number("keep-checkpoints", &Members::keep_checkpoints, R::Local, "keep the newest K checkpoints (1 to 1000000)"),
      number("checkpoint-every-steps", &Members::checkpoint_every_steps, R::Local,
             "also checkpoint every N steps (0: not by steps)"),
      duration("checkpoint-interval", &Members::checkpoint_interval_seconds, R::Local,
               "checkpoint when this much wall-clock time has passed since the last one: 90s, 10m, 1.5h (0: never)"),
      flag("checkpoint-each-epoch", &Members::checkpoint_each_epoch, R::Local, "also checkpoint after every epoch"),
      duration("checkpoint-lock-wait", &Members::checkpoint_lock_wait_seconds, R::Local,
               "while another live run holds --checkpoint-dir's lock, wait this long for it before refusing to "
               "start: 30s, 2m (0: refuse at once; hpcrun's relaunches wait --step-timeout + 1m for a lost "
               "attempt's rank, which its own step watchdog ends)"),
      resume(R::Local,
             "auto (the newest valid checkpoint in --checkpoint-dir, else a fresh start), none, or a checkpoint file"),
      path("init-from", &Members::init_from, R::Agree,
           "start a new run from a checkpoint's weights (a file, or a directory's newest): the parameters and "
           "batch-norm statistics whose names (layer indices counted without max pools) and shapes fit this model (an "
           "output layer for other classes, or any "
           "other that does not fit, starts from --seed), with a fresh optimizer and schedule from step 0, evaluated "
           "before the first step; fine-tuning, a new schedule, another dataset. A run that resumes from "
           "--checkpoint-dir ignores it"),
      flag("extend-epochs", &Members::extend_epochs, R::Agree,
           "on resume, let a larger --epochs than the checkpoint's lengthen the run (a finished one too): the "
           "learning-rate schedule is recomputed for the new length from the step the run stands at, said in the "
           "log and the metrics file (event extended)"),
      duration("step-timeout", &Members::step_timeout_seconds, R::Local,
               "end the job (exit code 124) when no step finishes for this long, as when a peer hangs or died inside "
               "an all-reduce (a checkpoint being written counts from its last synced chunk): 90s, 10m (0: never; "
               "else 1s to 1000h)"),
      duration("start-timeout", &Members::start_timeout_seconds, R::Local,
               "end the job (exit code 124) when set-up, from the options read to the first step, takes this long, as "
               "when a peer stopped or died while starting (a wait for --checkpoint-lock-wait does not count): 30m, "
               "2h (0: never; else 1s to 1000h)"),
      stop_signals(R::Local,
                   "the signals that make the run checkpoint at the next step boundary and exit 75 (\"requeue me\"), "
                   "from TERM, USR1, USR2 and HUP (submitit sends USR2, Lightning's default is USR1); one left out "
                   "ends the process as it would any program; a second TERM, or INT, always stops at once"),
      steps_or_auto("snapshot-every-steps", &Members::snapshot_every_steps, R::Local,
                    "with --checkpoint-dir: one process per host keeps the training state in host memory (a tmpfs) "
                    "every N steps, for --resume auto after a lost rank or host to continue from (auto: as often as "
                    "their copies cost under 1% of the step time; 0: off)"),
      path("snapshot-dir", &Members::snapshot_dir, R::Local,
           "where each host keeps the snapshots, a directory per run (default: /dev/shm/hpctrain-UID; it must be "
           "memory, or a disk local to the host)"),
      path("snapshot-max-memory", &Members::snapshot_max_memory, R::Local,
           "the most the snapshots may take on a host, as a size (512M, 4G) or a share of its memory or of the "
           "job's cgroup memory limit where smaller (default 25%); "
           "a run whose two snapshots would not fit takes none"),
  };
}

}  // namespace

const std::vector<OptionGroup>& option_table() {
  static const std::vector<OptionGroup> table{
      {"General", general()},
      {"Model and data", model_and_data()},
      {"Training", training()},
      {"Data parallelism (mpirun -np N hpctrain ...)", parallel()},
      {"Checkpoints, resume and failures", checkpoints()},
  };
  return table;
}

}  // namespace hpc::train

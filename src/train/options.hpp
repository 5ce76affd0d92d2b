// Every setting of a training run, with the defaults of the default job (the recipe of
// shared/bench/torch_peer.py), and the parser that fills them from the command line and a config
// file. The options themselves are one table (options.cpp, option_table): each entry names an
// option, the member it sets, its help and its rule for ranks and resume; the Boost options,
// --help, the cross-rank agreement check, the resume check and the checkpoint's record of the
// options are all made from it. The defaults are the members' initialisers below, which the
// table shows. Choices are enums here, parsed from their names once, while parsing.
#pragma once

#include <csignal>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/choice.hpp"
#include "core/log.hpp"
#include "data/dataset.hpp"
#include "nn/model.hpp"
#include "optim/schedule.hpp"

namespace hpc::train {

enum class Augment { Auto, On, Off };  // auto: on for cifar10, cifar100 and shards
inline constexpr Named<Augment> kAugmentNames[] = {{"auto", Augment::Auto}, {"on", Augment::On}, {"off", Augment::Off}};

enum class Device { Auto, Cpu, Cuda };  // auto: a GPU when one is visible
inline constexpr Named<Device> kDeviceNames[] = {{"auto", Device::Auto}, {"cpu", Device::Cpu}, {"cuda", Device::Cuda}};

// Where packed shards' JPEGs are decoded: auto (the GPU when training on it and nvJPEG loads)
enum class JpegDecode { Auto, Cpu, Gpu };
inline constexpr Named<JpegDecode> kJpegDecodeNames[] = {
    {"auto", JpegDecode::Auto}, {"cpu", JpegDecode::Cpu}, {"gpu", JpegDecode::Gpu}};

// GPU arithmetic: tf32 lets convolutions and matrix products use tensor cores with 10-bit
// mantissas (PyTorch's cuDNN default); fp32 keeps IEEE float (the CPU always computes fp32);
// bf16 and fp16 are mixed precision (fp16 with dynamic loss scaling).
enum class Precision { Fp32, Tf32, Bf16, Fp16 };
inline constexpr Named<Precision> kPrecisionNames[] = {
    {"fp32", Precision::Fp32}, {"tf32", Precision::Tf32}, {"bf16", Precision::Bf16}, {"fp16", Precision::Fp16}};
inline bool mixed_precision(Precision p) { return p == Precision::Bf16 || p == Precision::Fp16; }

// How progress is shown: auto (a live line redrawn in place on an interactive terminal, else
// lines), bar, lines (plain log lines every --log-every steps or --progress-interval), off.
enum class ProgressStyle { Auto, Bar, Lines, Off };
inline constexpr Named<ProgressStyle> kProgressNames[] = {
    {"auto", ProgressStyle::Auto}, {"bar", ProgressStyle::Bar}, {"lines", ProgressStyle::Lines}, {"off", ProgressStyle::Off}};
inline constexpr Named<log::Level> kLogLevelNames[] = {
    {"error", log::Level::Error}, {"warn", log::Level::Warn}, {"info", log::Level::Info}, {"debug", log::Level::Debug}};
inline constexpr Named<log::Stamps> kStampNames[] = {
    {"auto", log::Stamps::Auto}, {"on", log::Stamps::On}, {"off", log::Stamps::Off}};

// --resume: auto (the newest valid checkpoint in --checkpoint-dir), none, or a file.
enum class ResumeFrom { Auto, None, File };

struct TrainOptions {
  // what to train
  nn::ModelKind model = nn::ModelKind::Cnn;
  bool batch_norm = true;
  nn::InitScheme init = nn::InitScheme::KaimingUniform;
  data::DatasetKind dataset = data::DatasetKind::FashionMnist;
  std::string data_dir;  // empty: the dataset's default location
  int64_t train_samples = 0, test_samples = 0;  // > 0: use only the first N (short runs)
  Augment augment = Augment::Auto;
  int64_t image_size = 0;                       // packed shards: side of the square crops (0: 224)
  // how long
  int64_t epochs = 4;
  int64_t max_steps = 0;  // > 0: stop after this many steps in all
  int64_t batch_size = 64;          // per rank (the Horovod / DDP convention)
  int64_t global_batch_size = 0;    // > 0: samples per step over all ranks, instead of batch_size
  bool drop_last = true;
  int64_t eval_batch_size = 1000;
  // optimizer and schedule
  double lr = 0.1, momentum = 0.9, weight_decay = 5e-4, label_smoothing = 0.1;
  bool nesterov = true, decay_bias_and_norm = true;  // as torch.optim.SGD: every parameter decays
  optim::Schedule lr_schedule = optim::Schedule::OneCycle;
  double warmup_epochs = 0, lr_gamma = 0.1, min_lr = 0;
  std::vector<double> lr_step_epochs;
  double onecycle_pct_start = 0.3, onecycle_div_factor = 25, onecycle_final_div_factor = 1e4;
  bool cycle_momentum = true;
  double onecycle_base_momentum = 0.85, onecycle_max_momentum = 0.95;
  // run
  int64_t seed = 1;  // signed so that "-1" is rejected, not wrapped
  int threads = 0;  // 0: default_threads (the rank's share of its CPUs)
  // data parallelism
  double bucket_mb = 25;  // gradient all-reduce bucket size
  bool overlap = true;    // all-reduce buckets during the backward pass
  bool sync_batch_norm = false;  // batch statistics over all ranks (default: per rank, as DDP)
  std::string timeline_file;  // every rank's step timeline, a Chrome trace (train/trace.hpp); .jsonl: rank 0's buckets
  // checkpoints
  std::string checkpoint_dir;      // empty: no checkpoints
  int keep_checkpoints = 3;
  int64_t checkpoint_every_steps = 0;
  double checkpoint_interval_seconds = 600;  // 0: off
  bool checkpoint_each_epoch = false;
  ResumeFrom resume = ResumeFrom::Auto;
  std::string resume_file;  // ResumeFrom::File
  // A new run's first state: a checkpoint's parameters and batch-norm statistics, where their names
  // and shapes fit this model (the rest from --seed), with a fresh optimizer and schedule; a run
  // that resumes ignores it. Empty: from --seed alone.
  std::string init_from;
  bool extend_epochs = false;  // on resume, a larger --epochs than the checkpoint's lengthens the run
  double step_timeout_seconds = 600;  // the watchdog (train/watchdog.hpp); 0: off
  double checkpoint_lock_wait_seconds = 0;  // for the directory's lock (ckpt/dir_lock.hpp); 0: refuse at once
  // Each asks for a checkpoint and exit 75 (signals.hpp).
  std::vector<int> stop_signals = {SIGTERM, SIGUSR1, SIGUSR2, SIGHUP};
  // in-memory snapshots (train/snapshots.hpp)
  int64_t snapshot_every_steps = -1;        // -1: auto (their copies cost under 1% of the step time); 0: off
  std::string snapshot_dir;                 // empty: /dev/shm/hpctrain-UID
  std::string snapshot_max_memory = "25%";  // of the host's memory, or a size (512M, 4G)
  Device device = Device::Auto;
  Precision precision = Precision::Tf32;
  bool deterministic = true;  // GPU: only algorithms that give the same bits every run
  // GPU, one rank: replay each steady-state training step as one captured CUDA graph.
  bool cuda_graphs = false;
  JpegDecode jpeg_decode = JpegDecode::Cpu;  // auto once the GPU path has run on a GPU (issue 40)
  std::string metrics_file;
  int64_t metrics_every_steps = 0;  // > 0: rank 0 adds a step event to metrics_file every N steps
  std::string prometheus_file;      // rank 0's node_exporter textfile (train/step_metrics.hpp)
  bool quiet = false;
  int64_t log_every = 0;  // steps between plain progress lines; 0: by time (progress_interval_seconds)
  double progress_interval_seconds = 30;
  ProgressStyle progress = ProgressStyle::Auto;
  log::Level log_level = log::Level::Info;
  log::Stamps log_timestamps = log::Stamps::Auto;
};

// How an option may differ between the ranks of a job, and between a resumed run and the
// checkpoint it continues. Every entry of the table must say (no default: an entry without a
// rule does not compile).
enum class Rule {
  Local,  // may differ: where a rank reads and writes, how it speaks, when checkpoints are taken
  Agree,  // the same on every rank; a resumed run may change it (it does not change what a step
          // computes: the batch split, evaluation, the device and its arithmetic, how training starts)
  Match,  // the same on every rank, and as the checkpoint records it
};

struct OptionRule {
  std::string name;  // the long option, without "--"
  Rule rule;
};
// Every option of the table, in --help's order (not --help, --version and --config, which
// belong to the command line, not to a run).
std::vector<OptionRule> option_rules();

// The options that decide what is computed (rule Agree or Match), by long name with their values
// as text: every rank must agree on them, a checkpoint records them ("option.NAME"), and a
// resumed run must match those of rule Match.
std::vector<std::pair<std::string, std::string>> option_values(const TrainOptions& o);
// Every option of the table with its value as text (the metrics file's config event).
std::vector<std::pair<std::string, std::string>> all_option_values(const TrainOptions& o);
// What every rank compares (setup.cpp): option_values, and the Local options whose text must still
// be the same on every rank, as hpcrun, mpirun and the Slurm scripts give it: --checkpoint-dir,
// --resume and --snapshot-every-steps, which every rank's stop and resume follow (rank 0 alone
// writes the checkpoints, but a rank without them would wait in another collective). Not
// --snapshot-dir: where each host keeps its memory copies, read by that host's first rank alone.
std::vector<std::pair<std::string, std::string>> values_every_rank_shares(const TrainOptions& o);
// Whether a resumed run must match the checkpoint's value of this option (rule Match).
bool must_match_on_resume(const std::string& name);
// Whether a checkpoint's meta section records --NAME ("option.NAME", option_values' text; one
// written before an option was added lacks it).
bool records_option(const std::map<std::string, std::string>& meta, const std::string& name);
// The options `names` as a checkpoint's meta section records them, read back through the table
// (each option's inverse of its text), typed; the rest of the result keeps its defaults. One the
// checkpoint does not record, or records as text no run writes, is a usage error naming it.
TrainOptions recorded_options(const std::map<std::string, std::string>& meta,
                              const std::vector<std::string>& names);

// Checks shared with the other subcommands' options (train/commands.cpp): a usage error
// naming the option and the value.
void require_positive(int64_t v, const char* option);
void require_non_negative(int64_t v, const char* option);
void require_thread_count(int threads);  // --threads: 0 (all cores) to 4096
void require_batch_size(int64_t v, const char* option);  // 1 to a billion
// An option given an empty value is an unset variable ("--checkpoint-dir $DIR"), never a request
// for its default: a usage error naming the option when `value` is empty.
void require_not_empty(const std::string& value, const char* option);

// --help's text.
std::string help_text();

// Parses argv (and --config FILE). Returns nullopt when --help or --version was handled.
// Any problem is a usage error (exit code 2) naming it. Only a process with `speak` prints
// --help and --version (rank 0 of a multi-rank job).
std::optional<TrainOptions> parse_options(int argc, const char* const* argv, bool speak = true);

}  // namespace hpc::train

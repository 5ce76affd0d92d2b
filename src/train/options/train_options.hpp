// Every setting of a training run, with the defaults of the default job (the recipe of
// shared/bench/torch_peer.py): the members' initialisers below, which the option table
// (option_table.hpp) shows in --help. Choices are enums here, parsed from their names once, while
// parsing (options.hpp). Data only: what the engines, the run and the checkpoints read of a run's
// settings, without the parser.
#pragma once

#include <csignal>
#include <cstdint>
#include <string>
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

// CUDA graphs: auto (each steady training step replayed as one captured graph wherever that
// applies: one rank on its GPU; else the eager steps), on (--cuda-graphs: refused where it cannot
// apply), off (--no-cuda-graphs).
enum class CudaGraphs { Auto, On, Off };
inline constexpr Named<CudaGraphs> kCudaGraphsNames[] = {
    {"auto", CudaGraphs::Auto}, {"on", CudaGraphs::On}, {"off", CudaGraphs::Off}};

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
  // every rank's step timeline, a Chrome trace (train/observe/trace.hpp); .jsonl: rank 0's buckets
  std::string timeline_file;
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
  double step_timeout_seconds = 600;  // the watchdog (train/stop/watchdog.hpp); 0: off
  double start_timeout_seconds = 1800;  // set-up's watchdog (the same), to the first step; 0: off
  double checkpoint_lock_wait_seconds = 0;  // for the directory's lock (ckpt/dir_lock.hpp); 0: refuse at once
  // Each asks for a checkpoint and exit 75 (signals.hpp).
  std::vector<int> stop_signals = {SIGTERM, SIGUSR1, SIGUSR2, SIGHUP};
  // in-memory snapshots (train/state/snapshots.hpp)
  int64_t snapshot_every_steps = -1;        // -1: auto (their copies cost under 1% of the step time); 0: off
  std::string snapshot_dir;                 // empty: /dev/shm/hpctrain-UID
  std::string snapshot_max_memory = "25%";  // of the host's memory, or a size (512M, 4G)
  Device device = Device::Auto;
  Precision precision = Precision::Tf32;
  bool deterministic = true;  // GPU: only algorithms that give the same bits every run
  // GPU, one rank: replay each steady-state training step as one captured CUDA graph.
  CudaGraphs cuda_graphs = CudaGraphs::Auto;
  JpegDecode jpeg_decode = JpegDecode::Auto;  // the GPU's nvJPEG where it can (run on an H200, 2026-11-28)
  std::string metrics_file;
  int64_t metrics_every_steps = 0;  // > 0: rank 0 adds a step event to metrics_file every N steps
  std::string prometheus_file;      // rank 0's node_exporter textfile (train/observe/step_metrics.hpp)
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

}  // namespace hpc::train

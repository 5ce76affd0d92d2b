// Every setting of a training run, with the defaults of the default job (the recipe of
// shared/bench/torch_peer.py), and the command-line / config-file parser that fills them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace hpc::train {

struct TrainOptions {
  // what to train
  std::string model = "cnn";
  bool batch_norm = true;
  std::string init = "kaiming-uniform";  // | kaiming-normal (see nn::InitScheme)
  std::string dataset = "fashion-mnist";
  std::string data_dir;  // empty: the dataset's default location
  int64_t train_samples = 0, test_samples = 0;  // > 0: use only the first N (short runs)
  std::string augment = "auto";                 // auto (on for cifar10) | on | off
  int64_t image_size = 0;                       // packed shards: side of the square crops (0: 224)
  // how long
  int64_t epochs = 3;
  int64_t max_steps = 0;  // > 0: stop after this many steps in all
  int64_t batch_size = 64;          // per rank (the Horovod / DDP convention)
  int64_t global_batch_size = 0;    // > 0: samples per step over all ranks, instead of batch_size
  bool drop_last = true;
  int64_t eval_batch_size = 1000;
  // optimizer and schedule
  double lr = 0.1, momentum = 0.9, weight_decay = 5e-4, label_smoothing = 0;
  bool nesterov = true, decay_bias_and_norm = false;
  std::string lr_schedule = "onecycle";
  double warmup_epochs = 0, lr_gamma = 0.1, min_lr = 0;
  std::vector<double> lr_step_epochs;
  double onecycle_pct_start = 0.3, onecycle_div_factor = 25, onecycle_final_div_factor = 1e4;
  bool cycle_momentum = true;
  double onecycle_base_momentum = 0.85, onecycle_max_momentum = 0.95;
  // run
  int64_t seed = 1;  // signed so that "-1" is rejected, not wrapped
  int threads = 0;  // 0: the host's cores / the ranks on the host
  // data parallelism
  double bucket_mb = 25;  // gradient all-reduce bucket size
  bool overlap = true;    // all-reduce buckets during the backward pass
  bool sync_batch_norm = false;  // batch statistics over all ranks (default: per rank, as DDP)
  std::string timeline_file;  // rank 0 appends each step's bucket timeline (JSON Lines)
  // checkpoints
  std::string checkpoint_dir;      // empty: no checkpoints
  int keep_checkpoints = 3;
  int64_t checkpoint_every_steps = 0;
  double checkpoint_interval_seconds = 600;  // 0: off
  bool checkpoint_each_epoch = false;
  std::string resume = "auto";  // auto | none | a checkpoint file
  double step_timeout_seconds = 600;  // the watchdog (train/watchdog.hpp); 0: off
  std::string device = "auto";  // auto (a GPU when one is visible) | cpu | cuda
  // GPU arithmetic: tf32 lets convolutions and matrix products use tensor cores with 10-bit
  // mantissas (PyTorch's cuDNN default); fp32 keeps IEEE float (the CPU always computes fp32).
  std::string precision = "tf32";
  bool deterministic = true;  // GPU: only algorithms that give the same bits every run
  // GPU, one rank: replay each steady-state training step as one captured CUDA graph.
  bool cuda_graphs = false;
  std::string metrics_file;
  bool quiet = false;
  int64_t log_every = 0;  // steps between plain progress lines; 0: about ten per epoch
};

// Parses argv (and --config FILE). Returns nullopt when --help or --version was handled.
// Any problem is a usage error (exit code 2) naming it.
// The options that decide what is computed, by long name with their values as text: every
// rank must agree on them, and a resumed run on most (all but where rank 0 writes, how it
// speaks, the per-rank --threads and --data-dir, and the checkpoint settings).
std::vector<std::pair<std::string, std::string>> option_values(const TrainOptions& o);

// Checks shared with the other subcommands' options (train/commands.cpp): a usage error
// naming the option and the value.
void require_positive(int64_t v, const char* option);
void require_non_negative(int64_t v, const char* option);
void require_thread_count(int threads);  // --threads: 0 (all cores) to 4096
void require_batch_size(int64_t v, const char* option);  // 1 to a billion
// An option given an empty value is an unset variable ("--checkpoint-dir $DIR"), never a request
// for its default: a usage error naming the option when `value` is empty.
void require_not_empty(const std::string& value, const char* option);

// Only a process with `speak` prints --help and --version (rank 0 of a multi-rank job).
std::optional<TrainOptions> parse_options(int argc, const char* const* argv, bool speak = true);

}  // namespace hpc::train

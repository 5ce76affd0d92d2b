#include "train/trainer.hpp"

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <cmath>
#include <numeric>
#include <memory>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "core/device.hpp"
#include "core/hash.hpp"
#include "core/log.hpp"
#include "ckpt/store.hpp"
#include "data/loader.hpp"
#include "dist/agree.hpp"
#include "nn/gemm.hpp"
#include "optim/schedule.hpp"
#include "optim/sgd.hpp"
#include "train/checkpointing.hpp"
#include "train/engine.hpp"
#include "train/signals.hpp"
#include "train/metrics.hpp"
#include "train/watchdog.hpp"
#include "train/progress.hpp"

namespace hpc::train {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Which two ranks would share one GPU (NCCL refuses that), from the identities of the GPUs
// they would take; "" when none would. Every rank learns the same answer. Identities, not
// counts: under srun --gpus-per-task 1 each rank sees one GPU, its own.
std::string shared_gpu(dist::ProcessContext& ctx, const TrainOptions& o) {
  if (o.device == "cpu" || ctx.world_size() == 1) return "";  // o.device is every rank's (require_same_options)
  const uint64_t mine = device::gpu_identity(ctx.local_rank());
  const std::vector<uint64_t> all = ctx.world().allgather(mine);
  std::unordered_map<uint64_t, size_t> first;
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r] == 0) continue;
    const auto [it, fresh] = first.emplace(all[r], r);
    if (!fresh) return detail::concat("ranks ", it->second, " and ", r, " would share one GPU");
  }
  return "";
}

// Whether this rank trains on its GPU. --device cuda without a usable GPU is an error, never a
// silent CPU run (DESIGN.md principle 3); auto takes the GPUs when every rank can have one of
// its own (shared: shared_gpu's answer), and says so when it cannot.
bool resolve_device(const TrainOptions& o, const std::string& shared, bool speak) {
  std::string why;
  bool gpu = o.device != "cpu" && gpu_training_available(&why);
  const int gpus = o.device == "cpu" ? 0 : device::cuda_device_count();
  if (gpu && !shared.empty()) {
    why = detail::concat(shared, " (", gpus, " visible on this host); start one rank per GPU (mpirun -npernode ",
                         gpus, ", srun --gpus-per-task 1)");
    gpu = false;
  }
  HPC_REQUIRE(gpu || o.device != "cuda", "--device cuda: ", why, "; or use --device cpu");
  const std::string because = o.device == "cpu" ? "" : detail::concat(" (", why, ")");  // why not the GPU
  HPC_REQUIRE(gpu || (o.precision != "bf16" && o.precision != "fp16"), "--precision ", o.precision,
              " is mixed precision on the GPU, and this rank trains on the CPU", because,
              "; the CPU trains in fp32: use --precision fp32");
  HPC_REQUIRE(gpu || !o.cuda_graphs, "--cuda-graphs replays training steps on the GPU, and this rank trains on the CPU",
              because, "; leave out --cuda-graphs");
  if (speak && !gpu && o.device == "auto" && gpus > 0) log::warn("training on the CPU: ", why);
  if (gpu)
    HPC_REQUIRE(!o.sync_batch_norm, "--sync-batch-norm is not available on the GPU yet; leave it out or use "
                                    "--device cpu");
  return gpu;
}

data::AugmentSpec augment_spec(const TrainOptions& o) {
  const bool cifar = o.dataset == "cifar10" || o.dataset == "cifar100", shards = o.dataset == "shards";
  const bool on = o.augment == "on" || (o.augment == "auto" && (cifar || shards));
  if (!on) return {};
  if (shards) return {0, true, true};  // photographs: random resized crop and flip
  return {cifar ? 4 : 2, cifar};       // digits and clothes are not mirrored
}

optim::ScheduleSpec schedule_spec(const TrainOptions& o, double samples_per_epoch, double total_samples) {
  optim::ScheduleSpec s;
  s.kind = o.lr_schedule;
  s.lr = o.lr;
  s.total_samples = total_samples;
  s.warmup_samples = o.warmup_epochs * samples_per_epoch;
  for (double e : o.lr_step_epochs) s.step_samples.push_back(e * samples_per_epoch);
  s.gamma = o.lr_gamma;
  s.min_lr = o.min_lr;
  s.pct_start = o.onecycle_pct_start;
  s.div_factor = o.onecycle_div_factor;
  s.final_div_factor = o.onecycle_final_div_factor;
  s.cycle_momentum = o.cycle_momentum;
  s.base_momentum = o.onecycle_base_momentum;
  s.max_momentum = o.onecycle_max_momentum;
  return s;
}


std::string joined(const std::vector<std::pair<std::string, std::string>>& v) {
  std::string s;
  for (const auto& [name, value] : v) s += name + '=' + value + '\n';
  return s;
}

uint64_t hash_bytes(const void* p, size_t n) { return fnv1a(p, n); }

// A per-rank config file or a different command line on one host is caught before any work,
// naming the first option that differs.
void require_same_options(dist::ProcessContext& ctx, const TrainOptions& o) {
  const std::string mine = joined(option_values(o));
  dist::require_agreement(ctx, hash_bytes(mine.data(), mine.size()), ErrorKind::Usage, [&](int r) {
    const std::string theirs = dist::broadcast_string(ctx.world(), mine, r);
    std::istringstream a(mine), b(theirs);
    std::string la, lb;
    while (std::getline(a, la) && std::getline(b, lb))
      if (la != lb)
        return detail::concat("rank ", r, " was started with other options than rank 0 (a per-rank --config or "
                              "command line?): --", lb, " there, --", la, " on rank 0");
    return detail::concat("rank ", r, " was started with other options than rank 0");
  });
}

// Every rank must read the same samples: the same counts, shapes and labels.
void require_same_data(dist::ProcessContext& ctx, const data::DatasetPair& ds) {
  const int64_t shape[] = {ds.train.count, ds.test.count, ds.train.height, ds.train.width, ds.train.channels};
  const uint64_t h = hash_bytes(shape, sizeof shape) ^
                     hash_bytes(ds.train.labels.data(), ds.train.labels.size() * sizeof ds.train.labels[0]) ^
                     (hash_bytes(ds.test.labels.data(), ds.test.labels.size() * sizeof ds.test.labels[0]) << 1);
  dist::require_agreement(ctx, h, ErrorKind::Usage, [&](int r) {
    return detail::concat("rank ", r, " read a different dataset than rank 0 (", ds.train.count, " train and ",
                          ds.test.count, " test samples on rank 0): every host needs the same --data-dir contents");
  });
}

// Rank 0's parameters and buffers to every rank.
void broadcast_state(dist::Communicator& comm, nn::Model<float>& model) {
  if (comm.size() == 1) return;
  for (Tensor* t : {&model.params().values(), &model.params().buffers()})
    if (t->bytes() > 0) comm.broadcast(t->raw(), static_cast<int64_t>(t->bytes()), 0);
}

void require_same_parameters(dist::ProcessContext& ctx, const nn::Model<float>& model) {
  const Tensor& v = model.params().values();
  dist::require_agreement(ctx, hash_bytes(v.raw(), v.bytes()), ErrorKind::Internal, [&](int r) {
    return detail::concat("rank ", r, " holds other initial parameters than rank 0 after the broadcast");
  });
}

// One line per bucket: when it was queued, started and done, and when backward ended and the
// optimizer could go on (seconds since the step began, before its forward pass).
void write_timeline(MetricsWriter& out, int64_t step, const dist::BucketTimeline& t) {
  for (size_t b = 0; b < t.buckets.size(); ++b)
    out.write({{"step", step},
               {"bucket", static_cast<int64_t>(b)},
               {"begin", t.buckets[b].begin},
               {"end", t.buckets[b].end},
               {"queued", t.buckets[b].queued},
               {"started", t.buckets[b].started},
               {"done", t.buckets[b].done},
               {"backward_done", t.backward_done},
               {"finished", t.finished}});
}

// Test hooks for the resume and watchdog tests: HPCTRAIN_TEST_KILL_AFTER_STEP=k[@r][:stop]
// makes rank r (0 by default) die by SIGKILL right after global step k, as a lost node would
// (or stop by SIGSTOP, as a hung one); HPCTRAIN_TEST_SIGNAL_AFTER_STEP=k[@r][:usr1] sends it
// SIGTERM (or SIGUSR1) there instead.
struct TestKill {
  int64_t step = -1;
  int rank = 0;
  int signal = 0;
};
TestKill test_hook(const char* variable, int signal) {
  TestKill k;
  if (const char* v = std::getenv(variable)) {
    k.step = std::atoll(v);
    k.signal = std::strstr(v, ":usr1") ? SIGUSR1 : std::strstr(v, ":stop") ? SIGSTOP : signal;
    if (const char* at = std::strchr(v, '@')) k.rank = std::atoi(at + 1);
  }
  return k;
}

// The first stop signal any rank took (0: none), and the ranks that took one. Every rank
// learns the same.
struct StopAsked {
  int signal = 0, rank = 0, ranks = 0;
};
StopAsked stop_asked(dist::Communicator& comm) {
  const auto mine = static_cast<uint64_t>(StopSignals::signal_number());
  const std::vector<uint64_t> all = comm.size() > 1 ? comm.allgather(mine) : std::vector<uint64_t>{mine};
  StopAsked s;
  for (size_t r = all.size(); r-- > 0;)
    if (all[r] != 0) s = {static_cast<int>(all[r]), static_cast<int>(r), s.ranks + 1};
  return s;
}

// "SIGTERM"; "SIGTERM to rank 1" where only some of several ranks were signalled.
std::string cause_of(const StopAsked& s, int world) {
  return s.ranks == world ? signal_name(s.signal) : detail::concat(signal_name(s.signal), " to rank ", s.rank);
}

// 75, "requeue me", where the checkpoint directory holds the state to continue from; without
// one nothing is kept, and the code is the signal's, as if it had ended the process.
int stop_exit_code(const TrainOptions& o, const StopAsked& s) {
  return o.checkpoint_dir.empty() ? 128 + s.signal : kExitCheckpointed;
}

// Rank 0 writes checkpoints there; every rank learns whether it could use the directory.
std::unique_ptr<ckpt::CheckpointStore> open_store(dist::ProcessContext& ctx, const TrainOptions& o) {
  std::unique_ptr<ckpt::CheckpointStore> store;
  dist::collectively(ctx, [&] {
    if (ctx.rank() == 0 && !o.checkpoint_dir.empty())
      store = std::make_unique<ckpt::CheckpointStore>(o.checkpoint_dir, o.keep_checkpoints);
  });
  return store;
}

// Set-up ends each of its phases here (`phase` counts them for the test hook
// HPCTRAIN_TEST_SIGNAL_IN_SETUP=phase[@rank][:usr1]). A stop asked for on any rank ends the run
// before its first step, on every rank alike. Nothing new exists to save: the checkpoint
// directory already holds what a later run continues from (the checkpoint this one resumed
// from, or none: a fresh start), so it is the exit of a stop after a checkpoint, once the
// directory is known to be usable (dir_checked; else it is checked here, a usage error if not).
std::optional<TrainResult> stopped_in_setup(dist::ProcessContext& ctx, const TrainOptions& o, int phase,
                                            const char* during, bool dir_checked) {
  const TestKill hook = test_hook("HPCTRAIN_TEST_SIGNAL_IN_SETUP", SIGTERM);
  if (hook.step == phase && hook.rank == ctx.rank()) StopSignals::raise_and_wait(hook.signal);
  const StopAsked asked = stop_asked(ctx.world());
  if (!asked.signal) return std::nullopt;
  if (!dir_checked) open_store(ctx, o);
  if (ctx.rank() == 0)
    log::warn("stopped on request (", cause_of(asked, ctx.world_size()), ") ", during,
              ", before the first step: nothing to save",
              o.checkpoint_dir.empty() ? " (no --checkpoint-dir)" : " and nothing lost; run it again to continue");
  TrainResult r;
  r.exit_code = stop_exit_code(o, asked);
  return r;
}

bool finite(const Tensor& t) {
  const float* p = t.numel() ? t.data<float>() : nullptr;
  return std::all_of(p, p + t.numel(), [](float v) { return std::isfinite(v); });
}

// Training diverged: a loss, or the state about to be saved, is not finite. Nothing of it is
// saved (the newest checkpoint stays the last good one), and it is the user's learning rate;
// except in a fresh run's first step, whose loss no update has touched: that is hpctrain's bug.
[[noreturn]] void diverged(const TrainOptions& o, const std::string& what, bool before_any_update) {
  if (before_any_update)
    throw dist::CollectiveError(ErrorKind::Internal,
                                detail::concat("internal error at ", __FILE__, ":", __LINE__, ": ", what,
                                               " before any update of the initial parameters (not the options' doing)"));
  throw dist::CollectiveError(ErrorKind::Usage,
                              detail::concat("training diverged: ", what, "; lower --lr (now ", o.lr,
                                             ") or warm up to it (--warmup-epochs); no checkpoint holds this state"));
}

}  // namespace

int default_threads(int ranks_on_host) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, ranks_on_host));
}

EvalResult evaluate(nn::Model<float>& model, const data::Dataset& ds, const data::Normalization& norm,
                    int64_t batch_size, dist::Communicator* comm, const std::function<void()>& on_batch,
                    int decode_threads) {
  return evaluate([&](const data::Batch& b, double* sums) { eval_batch_cpu(model, b, sums); }, ds, norm, batch_size,
                  comm, on_batch, decode_threads);
}

EvalResult evaluate(const std::function<void(const data::Batch&, double*)>& run, const data::Dataset& ds,
                    const data::Normalization& norm, int64_t batch_size, dist::Communicator* comm,
                    const std::function<void()>& on_batch, int decode_threads, bool bytes) {
  // Each rank evaluates its contiguous part of the test set; the sums are then added up.
  const int rank = comm ? comm->rank() : 0, world = comm ? comm->size() : 1;
  const int64_t begin = ds.count * rank / world, end = ds.count * (rank + 1) / world;
  data::BatchAssembler assembler(ds, norm, {}, 0, decode_threads, bytes);
  data::Batch batch;
  double sums[2] = {0, 0};  // loss * samples, correct
  for (int64_t start = begin; start < end; start += batch_size) {
    const int64_t n = std::min(batch_size, end - start);
    std::vector<uint32_t> idx(n);
    std::iota(idx.begin(), idx.end(), static_cast<uint32_t>(start));
    assembler.assemble(idx, 0, false, batch);
    run(batch, sums);
    if (on_batch) on_batch();
  }
  if (comm && world > 1) comm->allreduce_sum(sums, 2);
  EvalResult r;
  r.samples = ds.count;
  r.loss = sums[0] / static_cast<double>(ds.count);
  r.accuracy = sums[1] / static_cast<double>(ds.count);
  return r;
}

TrainResult run_training(const TrainOptions& o, dist::ProcessContext& ctx) {
  const auto t_start = Clock::now();
  dist::Communicator& comm = ctx.world();
  const int rank = ctx.rank(), world = ctx.world_size();
  const bool lead = rank == 0;  // rank 0 speaks: progress, metrics, the done line
  if (o.quiet || !lead) log::set_level(log::Level::Warn);
  require_same_options(ctx, o);
  if (auto stopped = stopped_in_setup(ctx, o, 1, "while starting", false)) return *stopped;

  // Everything up to the first step can fail on one rank alone (a missing file on one
  // host): collectively() turns that into the same error on every rank.
  int threads = 0;
  bool gpu = false;
  std::string dir;
  data::DatasetPair ds;
  std::unique_ptr<nn::Model<float>> model_ptr;
  int64_t global_batch = 0;
  const std::string shared = shared_gpu(ctx, o);
  dist::collectively(ctx, [&] {
    gpu = resolve_device(o, shared, ctx.local_rank() == 0);  // one warning per host
    HPC_REQUIRE(!o.cuda_graphs || world == 1, "--cuda-graphs takes one rank per job for now (this one has ", world,
                "): the gradient all-reduce waits on the host, which a captured step cannot; leave it out");
    if (gpu) device::select_gpu(ctx.local_rank());  // fails here, on every rank, rather than inside NCCL's set-up
    threads = o.threads > 0 ? o.threads : default_threads(ctx.local_size());
    nn::set_math_threads(threads);
    dir = o.data_dir.empty() ? data::default_data_dir(o.dataset) : o.data_dir;
    ds = data::load_dataset(o.dataset, dir, o.image_size);
    ds.train.truncate(o.train_samples);
    ds.test.truncate(o.test_samples);
    global_batch = o.global_batch_size > 0 ? o.global_batch_size : o.batch_size * world;
    HPC_REQUIRE(global_batch >= world, "--global-batch-size ", global_batch, " gives some of the ", world,
                " ranks no sample per step; use at least one sample per rank");
    HPC_REQUIRE(ds.train.count >= global_batch || !o.drop_last, "the training set holds ", ds.train.count,
                " samples, fewer than one global batch of ", global_batch, " (", world, " ranks)");
    if (!o.drop_last) {  // --keep-last-batch: the short last batch must still give every rank what a step needs
      const data::ShardedSampler epoch(ds.train.count, global_batch, 0, 0, world, false);
      const int64_t steps = epoch.steps_per_epoch(), last = epoch.global_batch_length(steps - 1);
      const int64_t least = last / world, need = o.batch_norm ? 2 : 1;  // batch norm: two values per channel
      const bool reached = o.max_steps == 0 || o.max_steps >= steps;
      HPC_REQUIRE(last == global_batch || least >= need || !reached, "--keep-last-batch: the last global batch "
                  "holds ", last, " of the ", ds.train.count, " training samples, which leaves some of the ", world,
                  " ranks ", least, " (a step needs ", need, o.batch_norm ? ", for batch norm" : "",
                  "); leave out --keep-last-batch, or change --train-samples or the batch size");
    }
    nn::ModelSpec spec;
    spec.name = o.model;
    spec.batch_norm = o.batch_norm;
    spec.input = Shape{ds.train.height, ds.train.width, ds.train.channels};
    spec.classes = ds.train.classes;
    spec.label_smoothing = o.label_smoothing;
    spec.init = o.init == "kaiming-normal" ? nn::InitScheme::KaimingNormal : nn::InitScheme::KaimingUniform;
    model_ptr = std::make_unique<nn::Model<float>>(spec);
  });
  nn::Model<float>& model = *model_ptr;
  require_same_data(ctx, ds);
  if (auto stopped = stopped_in_setup(ctx, o, 2, "while loading the dataset", false)) return *stopped;
  // Batch norm's collectives run on the main thread while the bucket thread all-reduces
  // gradients: they get a communicator of their own (collectives on one communicator must
  // come in the same order on every rank, which two threads cannot promise).
  std::unique_ptr<dist::Communicator> stats_comm;
  if (o.sync_batch_norm) {  // on one rank too: the same arithmetic as on several
    dist::collectively(ctx, [&] {
      HPC_REQUIRE(ctx.thread_multiple(), "--sync-batch-norm needs an MPI library with MPI_THREAD_MULTIPLE");
    });
    stats_comm = comm.duplicate();
    model.sync_batch_norm([c = stats_comm.get()](double* data, int64_t n) { c->allreduce_sum(data, n); });
  }

  optim::Sgd<float> sgd(model.params(), {o.momentum, o.nesterov, o.weight_decay, o.decay_bias_and_norm});
  // Resume: rank 0 reads and verifies the checkpoint, every rank loads the same bytes. The
  // global batch is the checkpoint's (the sampler's position is in its global steps), so a
  // run can come back on another number of ranks and continue at the exact sample.
  std::string resume_path;
  const std::optional<ckpt::Checkpoint> resume = find_resume(o, ctx, &resume_path);
  RunPosition start;
  start.global_batch = global_batch;
  if (resume) {
    dist::collectively(ctx, [&] {
      start = check_resumable(*resume, o, model);
      HPC_REQUIRE(start.global_batch >= world, "the checkpoint's global batch of ", start.global_batch,
                  " cannot give each of the ", world, " ranks a sample");
      apply_checkpoint(*resume, model, sgd);
      // Written by a run that diverged (hpctrain writes none such now): it would only diverge on.
      HPC_REQUIRE(finite(model.params().values()) && finite(sgd.momentum_buffer()) && finite(model.params().buffers()),
                  resume_path, " holds a state that is not finite (its run had diverged): resume from an earlier ",
                  "checkpoint (--resume FILE) or start afresh (--resume none)");
    });
    global_batch = start.global_batch;
    log::info("resuming from ", resume_path, " at step ", start.step, " (epoch ", start.epoch + 1, ", step ",
              start.step_in_epoch, " of it), global batch ", global_batch);
  } else if (lead) {
    // Rank 0 creates the initial variables.
    model.init(static_cast<uint64_t>(o.seed));
  }
  // Every rank receives rank 0's state and proves it holds the same bytes before the first step.
  broadcast_state(comm, model);
  require_same_parameters(ctx, model);
  if (auto stopped = stopped_in_setup(ctx, o, 3, resume ? "while loading the checkpoint to resume from"
                                                        : "while initialising the model", false))
    return *stopped;

  data::ShardedSampler sampler(ds.train.count, global_batch, static_cast<uint64_t>(o.seed), rank, world,
                               o.drop_last);
  const int64_t spe = sampler.steps_per_epoch();
  const int64_t planned = o.epochs * spe;
  const int64_t total_steps = o.max_steps > 0 ? std::min(o.max_steps, planned) : planned;
  const double samples_per_epoch = static_cast<double>(o.drop_last ? spe * global_batch : ds.train.count);
  optim::LrSchedule schedule(
      schedule_spec(o, samples_per_epoch, static_cast<double>(total_steps) * samples_per_epoch / spe));
  // The GPU takes the batches as bytes and normalises them itself.
  data::Loader loader(ds.train, ds.norm, augment_spec(o), sampler, static_cast<uint64_t>(o.seed), 3, threads, gpu);
  MetricsWriter metrics = o.metrics_file.empty() || !lead ? MetricsWriter() : MetricsWriter(o.metrics_file);
  MetricsWriter timeline =
      o.timeline_file.empty() || !lead ? MetricsWriter() : MetricsWriter(o.timeline_file, "--timeline-file");
  // The engine takes the state as it now is (initialised or resumed, and broadcast).
  std::unique_ptr<Engine> engine =
      gpu ? make_gpu_engine(model, sgd, ctx, o) : make_cpu_engine(model, sgd, comm, o, threads);
  if (start.scaler) engine->restore_loss_scaler(*start.scaler);

  log::info("hpctrain ", HPCTRAIN_VERSION, ": ", model.summary());
  const std::string source =
      o.dataset == "synthetic"
          ? detail::concat("synthetic ", ds.train.height, "x", ds.train.width, " images made from a fixed seed")
          : detail::concat(o.dataset, " from ", dir);
  log::info("data: ", source, " (", ds.train.count, " train, ", ds.test.count,
            " test); ", world, " rank(s), global batch ", global_batch, ", ", spe, " steps per epoch, ", total_steps,
            " steps; ", engine->describe());
  if (world > 1)
    log::info("gradients all-reduced in ", engine->bucket_count(), " bucket(s) of up to ", o.bucket_mb, " MB",
              o.overlap ? ", overlapping the backward pass" : ", after the backward pass (--no-overlap)");

  // Checkpoints: rank 0 snapshots its state (all ranks hold the same parameters and
  // optimizer state; batch-norm statistics are rank 0's, as DDP saves them) and a background
  // thread writes it.
  std::unique_ptr<ckpt::CheckpointStore> store = open_store(ctx, o);
  if (store) store->supersede_after(resume ? start.step : -1);  // none newer when it continues the newest
  std::unique_ptr<ckpt::AsyncWriter> writer;
  if (store) writer = std::make_unique<ckpt::AsyncWriter>(*store);
  if (auto stopped = stopped_in_setup(ctx, o, 4, "while preparing the training engine", true)) return *stopped;
  int64_t checkpoints = 0, last_saved = -1;
  double checkpoint_stall = 0;
  auto last_checkpoint_time = Clock::now(), last_heartbeat = Clock::now() - std::chrono::hours(1);
  // Never saved nor reported done: a state that is not finite (the update after a finite loss
  // can make it so, and a layer can hide it from later losses). Collective; the ranks that
  // `check` look at their host copy, and every rank learns their verdict.
  auto require_finite_state = [&](int64_t after_step, bool check) {
    double bad[3] = {0, 0, 0};
    if (check) {
      engine->sync_to_host();
      bad[0] = !finite(model.params().values()), bad[1] = !finite(sgd.momentum_buffer());
      bad[2] = !finite(model.params().buffers());
    }
    if (world > 1) comm.allreduce_sum(bad, 3);
    const char* what = bad[0] > 0 ? "the parameters" : bad[1] > 0 ? "the optimizer's momentum"
                                                   : bad[2] > 0 ? "the batch-norm statistics" : nullptr;
    if (what) diverged(o, detail::concat(what, " are not finite after step ", after_step, ", though its loss still was"), false);
  };
  // Collective: every rank calls it at the same step, and learns whether rank 0 could hand the
  // snapshot over (it cannot after an earlier write failed in the background).
  auto save = [&](RunPosition at) {
    if (o.checkpoint_dir.empty() || at.step == last_saved) return;
    const auto t0 = Clock::now();
    require_finite_state(at.step, writer != nullptr);
    last_saved = at.step;
    dist::collectively(ctx, [&] {
      if (!writer) return;
      if (at.step_in_epoch >= spe) at.epoch += 1, at.step_in_epoch = 0;  // the next step opens the next epoch
      ckpt::Checkpoint snapshot = writer->recycled();
      at.scaler = engine->loss_scaler();
      fill_checkpoint(snapshot, o, model, sgd, world, at);
      writer->submit(std::move(snapshot), at.step);
    });
    checkpoint_stall += seconds_since(t0);
    last_checkpoint_time = Clock::now();
    ++checkpoints;
  };
  // Every rank learns whether rank 0's checkpoints were all written; `doing` says what for.
  auto finish_writes = [&](const std::string& doing) {
    dist::collectively(ctx, [&] {
      if (!writer) return;
      try {
        writer->wait();
      } catch (const Error& e) {
        throw Error(e.kind(), doing + ", but its checkpoint could not be written: " + e.what());
      }
    });
  };
  const TestKill kill_at = test_hook("HPCTRAIN_TEST_KILL_AFTER_STEP", SIGKILL);
  const TestKill signal_at = test_hook("HPCTRAIN_TEST_SIGNAL_AFTER_STEP", SIGTERM);
  bool stopping = false;
  RunPosition here = start;

  Progress progress(o.quiet || !lead, o.log_every, o.epochs, spe, total_steps);
  TrainResult result;
  double samples_seen = start.samples_seen, run_samples = 0, train_seconds = 0, comm_wait_seconds = 0;
  int64_t step = start.step;
  EvalResult eval;
  bool evaluated = false;
  // From here on every wait is for the peers: a step that never ends is a hung job.
  StepWatchdog watchdog(o.step_timeout_seconds, ctx.where());
  watchdog.progress(step);
  auto run_evaluation = [&] {
    return evaluate([&](const data::Batch& b, double* s) { engine->eval_batch(b, s); }, ds.test, ds.norm,
                    o.eval_batch_size, &comm, [&] { watchdog.progress(step); }, threads, gpu);
  };
  for (int64_t epoch = start.epoch; epoch < o.epochs && step < total_steps; ++epoch) {
    const auto t_epoch = Clock::now();
    loader.start_epoch(epoch, epoch == start.epoch ? start.step_in_epoch : 0);
    double sums[3] = {0, 0, 0};  // this rank's loss * samples, correct, samples
    int64_t epoch_global_samples = 0;
    while (step < total_steps) {
      const data::Batch* batch = loader.next();
      if (!batch) break;
      const int64_t global_len = sampler.global_batch_length(batch->step);
      const float share = static_cast<float>(static_cast<double>(batch->size()) / static_cast<double>(global_len));
      const StepResult r =
          engine->train_step(*batch, share, schedule.lr(samples_seen), schedule.momentum(samples_seen, o.momentum));
      const double loss = r.loss;
      comm_wait_seconds += r.comm_wait;
      if (!o.timeline_file.empty() && lead) write_timeline(timeline, step, engine->timeline());
      sums[1] += static_cast<double>(r.correct);
      samples_seen += static_cast<double>(global_len);
      run_samples += static_cast<double>(global_len);
      epoch_global_samples += global_len;
      sums[2] += static_cast<double>(batch->size());
      sums[0] += loss * static_cast<double>(batch->size());
      ++step;
      watchdog.progress(step);
      const double el = seconds_since(t_epoch);
      const double ips = static_cast<double>(epoch_global_samples) / std::max(el, 1e-9);
      const double eta = (train_seconds + el) / static_cast<double>(step) * static_cast<double>(total_steps - step);
      progress.step(epoch, batch->step, step - 1, sums[0] / sums[2], sums[1] / sums[2], ips, eta);
      here = RunPosition{step, epoch, batch->step + 1, global_batch, samples_seen, {}};
      if (signal_at.step == step && signal_at.rank == rank) StopSignals::raise_and_wait(signal_at.signal);
      if (store && seconds_since(last_heartbeat) >= 1.0) {
        ckpt::write_heartbeat(store->dir(), step, epoch);
        last_heartbeat = Clock::now();
      }
      // Every rank agrees at each step boundary on whether to stop (any rank was signalled),
      // whether rank 0's clock says a checkpoint is due, and whether any rank's loss is not finite.
      double flags[3] = {lead && o.checkpoint_interval_seconds > 0 &&
                                 seconds_since(last_checkpoint_time) >= o.checkpoint_interval_seconds
                             ? 1.0
                             : 0.0,
                         StopSignals::requested() ? 1.0 : 0.0, std::isfinite(loss) ? 0.0 : 1.0};
      if (world > 1) comm.allreduce_sum(flags, 3);
      if (flags[2] > 0)
        diverged(o, detail::concat("the loss of step ", step, " (epoch ", epoch + 1, ") is not finite"),
                 step == 1 && !resume);
      if ((o.checkpoint_every_steps > 0 && step % o.checkpoint_every_steps == 0) || flags[0] > 0) save(here);
      if (kill_at.step == step) {
        // The tests then know which checkpoint the resumed run starts from: what was submitted
        // is durable before the victim dies (on a loaded machine the write could otherwise
        // still be in flight). A kill in the middle of a write is what the pause hook is for.
        if (writer && !std::getenv("HPCTRAIN_TEST_PAUSE_BEFORE_RENAME")) writer->wait();
        if (world > 1) comm.barrier();
        if (kill_at.rank == rank) std::raise(kill_at.signal);
      }
      if (flags[1] > 0) {
        stopping = true;
        break;
      }
    }
    if (stopping) break;
    const double epoch_seconds = seconds_since(t_epoch);
    train_seconds += epoch_seconds;
    if (world > 1) comm.allreduce_sum(sums, 3);
    eval = run_evaluation();
    evaluated = true;
    const double seen = std::max(sums[2], 1.0);
    const double train_loss = sums[0] / seen;
    const double ips = static_cast<double>(epoch_global_samples) / std::max(epoch_seconds, 1e-9);
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  "epoch %lld/%lld: train loss %.4f  test loss %.4f  test accuracy %.2f%%  %.0f img/s  %s",
                  static_cast<long long>(epoch + 1), static_cast<long long>(o.epochs), train_loss, eval.loss,
                  100 * eval.accuracy, ips, format_duration(epoch_seconds).c_str());
    progress.line(buf);
    if (o.checkpoint_each_epoch) save({step, epoch + 1, 0, global_batch, samples_seen, {}});
    metrics.write({{"event", std::string("epoch")},
                   {"epoch", epoch + 1},
                   {"step", step},
                   {"train_loss", train_loss},
                   {"train_accuracy", sums[1] / seen},
                   {"test_loss", eval.loss},
                   {"test_accuracy", eval.accuracy},
                   {"images_per_second", ips},
                   {"train_seconds", train_seconds},
                   {"elapsed_seconds", seconds_since(t_start)}});
    // A stop asked for during the evaluation ends the run here, not after one more step.
    if (step < total_steps && stop_asked(comm).signal) {
      stopping = true;
      break;
    }
  }
  if (stopping) {
    // Asked to stop: checkpoint where we are and leave with "requeue me".
    const StopAsked asked = stop_asked(comm);
    const std::string cause = detail::concat("stopped on request (", cause_of(asked, world), ") after step ", step);
    save(here);
    finish_writes(cause);  // rank 0's checkpoint is durable before anyone exits
    if (store) ckpt::write_heartbeat(store->dir(), step, step / spe, "stopped");
    if (lead)
      log::warn(cause, o.checkpoint_dir.empty() ? "; nothing saved: no --checkpoint-dir"
                                                : "; checkpoint written, --resume auto continues from it");
    result.steps = step;
    result.exit_code = stop_exit_code(o, asked);
    return result;
  }
  if (!evaluated) {
    // Resumed from a checkpoint at the run's end (a finished run started again, as a job chain's
    // later segments do, or one stopped right after its last step): nothing left to train, but
    // the result reported is still the model's.
    if (lead) log::info("the checkpoint is at the run's last step (", step, "): nothing to train; evaluating");
    eval = run_evaluation();
  }
  // The final state (checked by save(), or here without a checkpoint directory), and every write
  // finished before reporting.
  if (o.checkpoint_dir.empty()) require_finite_state(step, true);
  save({step, o.epochs, 0, global_batch, samples_seen, {}});
  finish_writes(detail::concat("finished after step ", step));
  if (StopSignals::requested())  // on this rank: too late to stop before the end, which is as good
    log::warn("a stop was asked for (", signal_name(StopSignals::signal_number()),
              ") as the run was finishing; it finished instead");
  if (writer) {
    log::info("checkpoint: ", writer->last_written());
    ckpt::write_heartbeat(store->dir(), step, step / spe, "done");
  }
  engine->sync_to_host();
  const Tensor& values = model.params().values();
  result.steps = step;
  result.test_accuracy = eval.accuracy;
  result.test_loss = eval.loss;
  result.train_seconds = train_seconds;
  result.images_per_second = run_samples / std::max(train_seconds, 1e-9);
  result.param_checksum = fnv1a_hex(values.raw(), values.bytes());
  double norm2 = 0;
  for (int64_t i = 0; i < values.numel(); ++i) norm2 += static_cast<double>(values.data<float>()[i]) * values.data<float>()[i];
  const double run_steps = static_cast<double>(std::max<int64_t>(step - start.step, 1));  // steps this run took
  const double wait_per_step = comm_wait_seconds / run_steps;
  metrics.write({{"event", std::string("done")},
                 {"steps", step},
                 {"test_accuracy", eval.accuracy},
                 {"param_checksum", result.param_checksum},
                 {"param_norm", std::sqrt(norm2)},
                 {"images_per_second", result.images_per_second},
                 {"train_flops_per_sample", model.train_flops_per_sample()},
                 {"train_seconds", train_seconds},
                 {"world_size", world},
                 {"device", std::string(gpu ? "cuda" : "cpu")},
                 {"peak_device_memory_bytes", static_cast<int64_t>(engine->peak_device_memory())},
                 {"global_batch_size", global_batch},
                 {"comm_wait_seconds_per_step", wait_per_step},
                 {"step_seconds", train_seconds / run_steps},
                 {"resumed_from_step", resume ? start.step : int64_t{-1}},
                 {"skipped_steps", engine->loss_scaler() ? engine->loss_scaler()->skipped : int64_t{0}},
                 {"checkpoints_written", checkpoints},
                 {"checkpoint_stall_seconds", checkpoint_stall},
                 {"elapsed_seconds", seconds_since(t_start)}});
  char buf[240];
  std::snprintf(buf, sizeof buf, "done: %lld steps, test accuracy %.2f%%, %.0f img/s, param checksum %s",
                static_cast<long long>(step), 100 * eval.accuracy, result.images_per_second,
                result.param_checksum.c_str());
  log::info(buf);
  if (world > 1)
    log::info("exposed communication: ", 1e3 * wait_per_step, " ms per step (",
              100 * comm_wait_seconds / std::max(train_seconds, 1e-9),
              "% of the step time)");
  return result;
}

}  // namespace hpc::train

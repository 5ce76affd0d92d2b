#include "train/run/setup.hpp"

#include <csignal>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <unordered_map>

#include "core/device.hpp"
#include "core/hash.hpp"
#include "core/log.hpp"
#include "data/nvjpeg.hpp"
#include "data/sampler.hpp"
#include "dist/agree.hpp"
#include "nn/gemm.hpp"
#include "train/engine/engine.hpp"
#include "train/run/boundary.hpp"
#include "train/serve/serving.hpp"
#include "train/stop/signals.hpp"

namespace hpc::train {
namespace {

// Which two ranks would share one GPU (NCCL refuses that), from the identities of the GPUs
// they would take; "" when none would. Every rank learns the same answer. Identities, not
// counts: under srun --gpus-per-task 1 each rank sees one GPU, its own.
std::string shared_gpu(dist::ProcessContext& ctx, const TrainOptions& o) {
  if (o.device == Device::Cpu || ctx.world_size() == 1) return "";  // o.device is every rank's (require_same_options)
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
// its own (shared: shared_gpu's answer), and says so when it cannot (why: why not the GPU).
bool resolve_device(const TrainOptions& o, const std::string& shared, bool speak, std::string& why) {
  bool gpu = o.device != Device::Cpu && gpu_training_available(&why);
  const int gpus = o.device == Device::Cpu ? 0 : device::cuda_device_count();
  if (gpu && !shared.empty()) {
    why = detail::concat(shared, " (", gpus, " visible on this host); start one rank per GPU (mpirun -npernode ",
                         gpus, ", srun --gpus-per-task 1)");
    gpu = false;
  }
  HPC_REQUIRE(gpu || o.device != Device::Cuda, "--device cuda: ", why, "; or use --device cpu");
  const std::string because = o.device == Device::Cpu ? "" : detail::concat(" (", why, ")");  // why not the GPU
  HPC_REQUIRE(gpu || !mixed_precision(o.precision), "--precision ", name_of(kPrecisionNames, o.precision),
              " is mixed precision on the GPU, and this rank trains on the CPU", because,
              "; the CPU trains in fp32: use --precision fp32");
  HPC_REQUIRE(gpu || o.cuda_graphs != CudaGraphs::On, "--cuda-graphs replays training steps on the GPU, and this rank trains on the CPU",
              because, "; leave out --cuda-graphs");
  if (speak && !gpu && o.device == Device::Auto && gpus > 0) log::warn("training on the CPU: ", why);
  if (gpu)
    HPC_REQUIRE(!o.sync_batch_norm || !o.batch_norm,
                "--sync-batch-norm is not available on the GPU yet; leave it out or use --device cpu");
  return gpu;
}

// Every rank trains where rank 0 does. Under --device auto each rank looks for its GPU on its
// own: a rank that sees none (CUDA_VISIBLE_DEVICES= on one host, a driver missing there) would
// take the CPU path while the others entered NCCL's set-up, and the job hung until
// --start-timeout. HPCTRAIN_TEST_CLAIM_GPU=r makes rank r of a machine without a GPU claim one
// (the planted disagreement of this check's test).
void require_same_device(dist::ProcessContext& ctx, const TrainOptions& o, bool gpu, const std::string& why) {
  if (o.device != Device::Auto || ctx.world_size() == 1) return;  // o.device is every rank's (require_same_options)
  const std::string mine = ctx.where() + (gpu ? " would train on its GPU" : " would train on the CPU (" + why + ")");
  dist::require_agreement(ctx, gpu ? 1 : 0, ErrorKind::Usage, [&](int r) {
    return detail::concat("--device auto: ", dist::broadcast_string(ctx.world(), mine, r), ", ",
                          dist::broadcast_string(ctx.world(), mine, 0), ": every rank trains on the same device; give "
                          "each rank a GPU of its own, or use --device cpu");
  });
}

// Where this rank trains (p.gpu), the same on every rank.
void resolve_devices(dist::ProcessContext& ctx, const TrainOptions& o, Prepared& p) {
  const std::string shared = shared_gpu(ctx, o);
  std::string why;
  dist::collectively(ctx, [&] {
    p.gpu = resolve_device(o, shared, ctx.local_rank() == 0, why);  // one warning per host
    if (const char* claim = std::getenv("HPCTRAIN_TEST_CLAIM_GPU"); claim && std::atoi(claim) == ctx.rank()) p.gpu = true;
  });
  require_same_device(ctx, o, p.gpu, why);
}

// The device and math threads of this rank (p.gpu: resolve_devices).
void choose_device(dist::ProcessContext& ctx, const TrainOptions& o, Prepared& p) {
  p.gpu_decode = resolve_jpeg_decode(o, p.gpu, ctx.local_rank() == 0);
  if (p.gpu) device::select_gpu(ctx.local_rank());  // fails here, on every rank, rather than inside NCCL's set-up
  p.threads = dist::math_threads(ctx, o.threads);
  nn::set_math_threads(p.threads);
  // More math threads on a host than the CPUs its ranks may use: they take turns, every step
  // waits for the slowest, and the step time varies. Said once per host, by its first rank.
  const double share = ctx.cpu_share();
  if (!p.gpu && ctx.local_rank() == 0 && p.threads > share + 1e-9)
    log::warn("the ranks on ", ctx.host(), " share cores: ", ctx.local_size(), " rank(s) with ", p.threads,
              " math thread(s) each, and a rank's share of the CPUs they may use is ", share,
              " (oversubscribed: slower, and step times vary); give fewer ranks per host",
              o.threads > 0 ? " or fewer --threads" : std::getenv("OMP_NUM_THREADS") ? " or a smaller OMP_NUM_THREADS" : "");
}

// --keep-last-batch: the short last batch must still give every rank what a step needs.
void check_last_batch(const TrainOptions& o, const data::Dataset& train, int64_t global_batch, int world) {
  const data::ShardedSampler epoch(train.count, global_batch, 0, 0, world, false);
  const int64_t steps = epoch.steps_per_epoch(), last = epoch.global_batch_length(steps - 1);
  const int64_t least = last / world, need = o.batch_norm ? 2 : 1;  // batch norm: two values per channel
  const bool reached = o.max_steps == 0 || o.max_steps >= steps;
  HPC_REQUIRE(last == global_batch || least >= need || !reached, "--keep-last-batch: the last global batch "
              "holds ", last, " of the ", train.count, " training samples, which leaves some of the ", world,
              " ranks ", least, " (a step needs ", need, o.batch_norm ? ", for batch norm" : "",
              "); leave out --keep-last-batch, or change --train-samples or the batch size");
}

// Whether the training set's batches of `global_batch` can be trained on `world` ranks. Checked
// with the global batch the run trains with: the checkpoint's when it resumes (checked against
// this run's, a resume on more ranks was refused or left a rank an empty last batch).
void check_batches(const TrainOptions& o, const data::Dataset& train, int64_t global_batch, int world) {
  HPC_REQUIRE(train.count >= global_batch || !o.drop_last, "the training set holds ", train.count,
              " samples, fewer than one global batch of ", global_batch, " (", world, " ranks)");
  if (!o.drop_last) check_last_batch(o, train, global_batch, world);
}

// The dataset (cut to --train-samples and --test-samples) and this run's global batch.
void load_data(const TrainOptions& o, int world, Prepared& p) {
  p.data_dir = o.data_dir.empty() ? data::default_data_dir(o.dataset) : o.data_dir;
  p.ds = data::load_dataset(o.dataset, p.data_dir, o.image_size);
  p.ds.train.truncate_to_option(o.train_samples, "--train-samples", "training");
  p.ds.test.truncate_to_option(o.test_samples, "--test-samples", "test");
  const int64_t global_batch = o.global_batch_size > 0 ? o.global_batch_size : o.batch_size * world;
  HPC_REQUIRE(global_batch >= world, "--global-batch-size ", global_batch, " gives some of the ", world,
              " ranks no sample per step; use at least one sample per rank");
  p.start.global_batch = global_batch;
}

std::unique_ptr<nn::Model<float>> build_model(const TrainOptions& o, const data::Dataset& train) {
  nn::ModelSpec spec;
  spec.kind = o.model;
  spec.batch_norm = o.batch_norm;
  spec.input = Shape{train.height, train.width, train.channels};
  spec.classes = train.classes;
  spec.label_smoothing = o.label_smoothing;
  spec.init = o.init;
  return std::make_unique<nn::Model<float>>(spec);
}

std::string joined(const std::vector<std::pair<std::string, std::string>>& v) {
  std::string s;
  for (const auto& [name, value] : v) s += name + '=' + value + '\n';
  return s;
}

// Every rank must read the same samples: the same counts, shapes and labels.
void require_same_data(dist::ProcessContext& ctx, const data::DatasetPair& ds) {
  const std::string seen = detail::concat(ds.train.count, " train and ", ds.test.count, " test samples of ",
                                          ds.train.height, "x", ds.train.width, "x", ds.train.channels);
  const uint64_t labels = fnv1a(ds.train.labels.data(), ds.train.labels.size() * sizeof ds.train.labels[0]) ^
                          (fnv1a(ds.test.labels.data(), ds.test.labels.size() * sizeof ds.test.labels[0]) << 1);
  dist::require_same_text(ctx, seen, ErrorKind::Usage, [&](int r, const std::string& theirs) {
    const std::string host = dist::broadcast_string(ctx.world(), ctx.host(), r);
    const std::string what = theirs == seen ? detail::concat("other labels of ", seen)
                                            : detail::concat(theirs, " there; ", seen, " on rank 0");
    return detail::concat("rank ", r, " on ", host, " read a different dataset than rank 0 (", what,
                          "): every host needs the same --data-dir contents");
  }, labels);
}

// Batch norm's collectives run on the main thread while the bucket thread all-reduces
// gradients: they get a communicator of their own (collectives on one communicator must come in
// the same order on every rank, which two threads cannot promise). On one rank too: the same
// arithmetic as on several.
void enable_sync_batch_norm(dist::ProcessContext& ctx, Prepared& p) {
  dist::collectively(ctx, [&] {
    HPC_REQUIRE(ctx.thread_multiple(), "--sync-batch-norm needs an MPI library with MPI_THREAD_MULTIPLE");
  });
  p.stats_comm = ctx.world().duplicate();
  p.model->sync_batch_norm([c = p.stats_comm.get()](double* data, int64_t n) { c->allreduce_sum(data, n); });
}

// Rank 0 reads and verifies the checkpoint, every rank receives the same bytes and checks that
// they fit this run. The global batch is the checkpoint's (the sampler's position is in its
// global steps), so a run can come back on another number of ranks and continue at the exact
// sample.
void resume_from(dist::ProcessContext& ctx, const TrainOptions& o, ckpt::Checkpoint c, const std::string& path,
                 Prepared& p) {
  dist::collectively(ctx, [&] {
    try {
      p.start = check_resumable(c, o, *p.model, p.ds.train.count);
      require_valid_norm_statistics(c, *p.model);
    } catch (const Error& e) {  // its messages say "the checkpoint": which one
      if (e.kind() != ErrorKind::Usage) throw;
      usage_error(path, ": ", e.what());
    }
    require_same_classes(c, p.ds.train.class_names, "the packed dataset " + p.ds.train.source);
    try {
      require_same_training_set(c, training_set_digest(p.ds.train), p.ds.train.source);
    } catch (const Error& e) {
      usage_error(path, ": ", e.what());
    }
    HPC_REQUIRE(p.start.global_batch >= ctx.world_size(), "the checkpoint's global batch of ", p.start.global_batch,
                " cannot give each of the ", ctx.world_size(), " ranks a sample");
    check_batches(o, p.ds.train, p.start.global_batch, ctx.world_size());
    // Written by a run that diverged (hpctrain writes none such now): it would only diverge on.
    HPC_REQUIRE(!first_non_finite(c), path, " holds a state that is not finite (its run had diverged): resume from "
                "an earlier checkpoint (--resume FILE) or start afresh (--resume none)");
  });
  if (o.extend_epochs) {
    const int64_t before = recorded_options(c.meta, {"epochs"}).epochs;
    if (before != o.epochs) p.extended_from_epochs = before;
  }
  p.resume = std::move(c);
  p.resumed = true;
  log::info("resuming from ", path, " at step ", p.start.step, " (epoch ", p.start.epoch + 1, ", step ",
            p.start.step_in_epoch, " of it), global batch ", p.start.global_batch);
}

// --init-from: the checkpoint's model (read by rank 0, built on every rank) into this run's, where
// its tensors fit. The same model, so that names mean the same layers; nothing fitting at all is
// an error, and a kept output layer whose classes have other names a warning.
Prepared::InitialWeights initial_weights(dist::ProcessContext& ctx, const TrainOptions& o, Prepared& p) {
  ServingModel from = load_serving_model(o.init_from, "", ctx);
  Prepared::InitialWeights w;
  dist::collectively(ctx, [&] {
    const char* model = nn::model_name(p.model->spec().kind);
    HPC_REQUIRE(from.checkpoint.text("model") == model, "--init-from ", from.path, " is of model ",
                from.checkpoint.text("model"), "; this run's --model is ", model);
    w.path = from.path;
    w.step = from.checkpoint.integer("step");
    w.fitted = copy_fitting_state(*from.model, *p.model);
    HPC_REQUIRE(w.fitted.copied > 0, "--init-from ", from.path, ": none of its ", model, "'s tensors fits this one");
    const std::optional<std::vector<std::string>> names = class_names_of(from.checkpoint);
    const bool head_kept = from.model->spec().classes == p.model->spec().classes;
    if (ctx.rank() == 0 && head_kept && names && !p.ds.train.class_names.empty() && *names != p.ds.train.class_names)
      log::warn("--init-from ", from.path, " was trained on classes of other names than this dataset's (",
                p.ds.train.source, "); its output layer is kept, and its outputs were for those classes");
  });
  return w;
}

// Rank 0's initial parameters and buffers to every rank, which proves it holds the same bytes.
void broadcast_state(dist::ProcessContext& ctx, nn::Model<float>& model) {
  dist::Communicator& comm = ctx.world();
  if (comm.size() > 1)
    for (Tensor* t : {&model.params().values(), &model.params().buffers()})
      if (t->bytes() > 0) comm.broadcast(t->raw(), static_cast<int64_t>(t->bytes()), 0);
  const Tensor& v = model.params().values();
  dist::require_agreement(ctx, fnv1a(v.raw(), v.bytes()), ErrorKind::Internal, [&](int r) {
    return detail::concat("rank ", r, " holds other initial parameters than rank 0 after the broadcast");
  });
}

}  // namespace

bool resolve_jpeg_decode(const TrainOptions& o, bool gpu, bool speak) {
  if (o.jpeg_decode == JpegDecode::Cpu) return false;
  std::string why;
  if (!gpu) why = "this rank trains on the CPU";
  else if (o.dataset != data::DatasetKind::Shards)
    why = detail::concat("the dataset is ", data::dataset_name(o.dataset),
                         ", not packed JPEG shards (--dataset shards)");
  else if (!data::NvjpegLibrary::load_installed(&why))
    why += "; install CUDA's nvJPEG (package libnvjpeg-13-0)";
  if (why.empty()) return true;
  HPC_REQUIRE(o.jpeg_decode != JpegDecode::Gpu, "--jpeg-decode gpu: ", why, "; or use --jpeg-decode cpu");
  // (A CPU run decodes on the CPU as a matter of course: only a GPU run is told why not there.)
  if (speak && gpu && o.dataset == data::DatasetKind::Shards) log::info("JPEG decode on the CPU threads: ", why);
  return false;
}

void require_same_options(dist::ProcessContext& ctx, const TrainOptions& o) {
  const std::string mine = joined(values_every_rank_shares(o));
  dist::require_same_text(ctx, mine, ErrorKind::Usage, [&](int r, const std::string& theirs) {
    std::istringstream a(mine), b(theirs);
    std::string la, lb;
    while (std::getline(a, la) && std::getline(b, lb))
      if (la != lb)
        return detail::concat("rank ", r, " was started with other options than rank 0 (a per-rank --config or "
                              "command line?): --", lb, " there, --", la, " on rank 0");
    return detail::concat("rank ", r, " was started with other options than rank 0");
  });
}

Prepared load_data_and_model(dist::ProcessContext& ctx, const TrainOptions& o) {
  Prepared p;
  resolve_devices(ctx, o, p);
  dist::collectively(ctx, [&] {
    choose_device(ctx, o, p);
    load_data(o, ctx.world_size(), p);
    p.model = build_model(o, p.ds.train);
  });
  require_same_data(ctx, p.ds);
  return p;
}

void resume_or_initialise(dist::ProcessContext& ctx, const TrainOptions& o, Prepared& p, const std::string& run_dir,
                          const std::string& run_id) {
  if (o.sync_batch_norm) enable_sync_batch_norm(ctx, p);
  p.sgd = std::make_unique<optim::Sgd<float>>(p.model->params(), optim::SgdSpec{o.momentum, o.nesterov,
                                                                                 o.weight_decay,
                                                                                 o.decay_bias_and_norm});
  FoundState found = find_resume_state(ctx, o, *p.model, p.ds.train.count, run_dir, run_id);
  if (found.state) {
    p.source = found.source;
    if (!o.init_from.empty() && ctx.rank() == 0)
      log::info("--init-from ", o.init_from, " is for the run's first start: it resumes from its own state");
    return resume_from(ctx, o, std::move(*found.state), found.path, p);
  }
  dist::collectively(ctx, [&] { check_batches(o, p.ds.train, p.start.global_batch, ctx.world_size()); });
  if (ctx.rank() == 0) p.model->init(static_cast<uint64_t>(o.seed));  // rank 0 creates the initial variables
  if (!o.init_from.empty()) p.init_from = initial_weights(ctx, o, p);
  broadcast_state(ctx, *p.model);
}

std::optional<int> stopped_in_setup(dist::ProcessContext& ctx, const TrainOptions& o, int phase, const char* during,
                                    bool dir_checked, const std::function<void()>& save) {
  const TestHook hook = TestHook::from_environment("HPCTRAIN_TEST_SIGNAL_IN_SETUP", SIGTERM);
  if (hook.fires(phase, ctx.rank())) StopSignals::raise_and_wait(hook.signal);
  const StopAsked asked = stop_asked(ctx.world());
  if (!asked.signal) return std::nullopt;
  if (!dir_checked) open_store(ctx, o);
  if (save) save();
  if (ctx.rank() == 0)
    log::warn("stopped on request (", cause_of(asked, ctx.world_size()), ") ", during, ", before the first step: ",
              save ? "the state it resumed from a host's memory is checkpointed; run it again to continue"
                   : o.checkpoint_dir.empty() ? "nothing to save (no --checkpoint-dir)"
                                              : "nothing to save and nothing lost; run it again to continue");
  return stop_exit_code(o, asked);
}

}  // namespace hpc::train

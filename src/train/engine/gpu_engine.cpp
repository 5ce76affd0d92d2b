// The GPU engine: the model mirrored on this rank's GPU (nn/cuda), the SGD update as one
// kernel over the arena (optim/sgd_cuda), gradients all-reduced by NCCL in buckets that
// overlap the backward pass. Compiled when CMake finds CUDA, cuDNN and NCCL.
//
// Streams and their dependencies (DESIGN.md principle 6), as PyTorch DDP and llm.c order them:
//  - Everything of a step runs on the context's compute stream (non-blocking), in order: the
//    batch copy, forward, loss, backward, the SGD update.
//  - A bucket's all-reduce runs on the NCCL communicator's stream. As the bucketer queues a
//    bucket (main thread, no communication thread), NcclBuckets records the fence event on the
//    compute stream after the backward kernels enqueued so far (which produced that bucket),
//    makes the NCCL stream wait for it (cudaStreamWaitEvent) and enqueues the all-reduce there
//    (ncclAvg, or a pre-multiplied sum: the rank's share applied in the same pass).
//  - GradientBucketer::finish() joins: the done event recorded on the NCCL stream after the
//    last all-reduce, which the compute stream waits for before the update. No host thread
//    waits or spins; a lost peer surfaces through the step watchdog's poll of NCCL's
//    asynchronous error (Engine::async_error).
//  - One GPU: no NCCL communicator and no bucketer (nothing to reduce: the share is 1), unless
//    HPCTRAIN_TEST_FORCE_NCCL=1 makes one so that the GPU tests exercise this path on one GPU.
//  - The step ends by reading the loss back, which waits for the compute stream: the pinned
//    staging buffers are then free for the next batch.
//  - An in-memory snapshot (begin_snapshot) copies the parameters and momentum to pinned host
//    memory on a side stream, behind an event recorded at the step boundary, while the next
//    step's forward and backward run; that step's update waits for the copy's event (a replayed
//    graph: its launch does). The snapshot's writer thread waits for the event and moves the
//    pinned copy into the snapshot (complete_snapshot), off the step loop.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "core/device.hpp"
#include "core/handle.hpp"
#include "core/log.hpp"
#include "dist/nccl.hpp"
#include "kernels/kernels.hpp"
#include "nn/cuda/network.hpp"
#include "optim/sgd_cuda.hpp"
#include "train/engine/cuda_memory.hpp"
#include "train/engine/engine.hpp"

namespace hpc::train {
namespace {

// An event for ordering only (no timing), made and destroyed with its owner (core/handle.hpp).
struct CudaEvent : Handle<cudaEvent_t, cudaEventDestroy> {
  CudaEvent() { CUDA_CHECK(cudaEventCreateWithFlags(out(), cudaEventDisableTiming)); }
};

// A stream of its own that does not synchronise with the legacy default stream.
struct CudaStream : Handle<cudaStream_t, cudaStreamDestroy> {
  CudaStream() { CUDA_CHECK(cudaStreamCreateWithFlags(out(), cudaStreamNonBlocking)); }
};

// A captured CUDA graph and its executable instance.
class Graph {
 public:
  explicit Graph(cudaGraph_t g) : graph_(g) {
    const cudaError_t e = cudaGraphInstantiate(&exec_, graph_, 0);
    if (e != cudaSuccess) {
      cudaGraphDestroy(graph_);
      CUDA_CHECK(e);
    }
  }
  ~Graph() {
    if (exec_) cudaGraphExecDestroy(exec_);
    cudaGraphDestroy(graph_);
  }
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  cudaGraphExec_t exec() const { return exec_; }

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

// The bucketer's device (dist/bucketer.hpp): each bucket's all-reduce enqueued on the NCCL
// stream behind a fence on the compute stream; the join makes the compute stream wait. The
// network's deferred 16-bit weight gradients land in the fp32 arena before each fence
// (GpuNetwork::land_grads): one conversion a bucket, not one a layer.
class NcclBuckets final : public dist::BucketDevice {
 public:
  NcclBuckets(dist::NcclCommunicator& nccl, nn::cuda::GpuNetwork& net)
      : nccl_(nccl), net_(net), compute_(net.context().stream()) {}

  // One fence event serves every bucket: cudaStreamWaitEvent takes the event's state at the
  // call, so recording it again for the next bucket does not change what this one waits for.
  void enqueue(float* x, int64_t n, float share) override {
    net_.land_grads();
    CUDA_CHECK(cudaEventRecord(fence_.get(), compute_));
    CUDA_CHECK(cudaStreamWaitEvent(nccl_.stream(), fence_.get(), 0));
    nccl_.enqueue_weighted_sum(x, n, share);
  }

  void join() override {
    CUDA_CHECK(cudaEventRecord(done_.get(), nccl_.stream()));
    CUDA_CHECK(cudaStreamWaitEvent(compute_, done_.get(), 0));
  }

 private:
  dist::NcclCommunicator& nccl_;
  nn::cuda::GpuNetwork& net_;
  cudaStream_t compute_;
  CudaEvent fence_, done_;
};

// Whether a test option of the GPU tests (README) is set to 1.
bool test_hook_on(const char* name) {
  const char* v = std::getenv(name);
  return v && std::string(v) == "1";
}

// The test option: an NCCL communicator and the bucketed all-reduce even at world size 1.
bool nccl_forced() { return test_hook_on("HPCTRAIN_TEST_FORCE_NCCL"); }

// The test option of the GPU tests: fp16's first loss scale (a power of two), where the
// default 2^16 may never overflow in a short run; a restored checkpoint's scale still wins.
optim::LossScaler first_loss_scaler() {
  const char* v = std::getenv("HPCTRAIN_TEST_LOSS_SCALE");
  if (!v || !*v) return optim::LossScaler();
  char* end = nullptr;
  const double scale = std::strtod(v, &end);
  HPC_CHECK(*end == '\0' && scale >= 1 && scale <= 1099511627776.0 && std::exp2(std::round(std::log2(scale))) == scale,
            "HPCTRAIN_TEST_LOSS_SCALE='", v, "' is not a power of two from 1 to 2^40");
  optim::LossScalerState s;
  s.scale = scale;
  return optim::LossScaler(s);
}

// The test option of the GPU tests: every capture fails, as a library call refused inside a
// capture would make it.
bool capture_fails_for_test() { return test_hook_on("HPCTRAIN_TEST_FAIL_CAPTURE"); }

nn::cuda::GpuSettings settings_of(const EngineSpec& o) {
  nn::cuda::GpuSettings s;
  using nn::cuda::Math;
  s.math = o.precision == Precision::Fp32   ? Math::Fp32
           : o.precision == Precision::Bf16 ? Math::Bf16
           : o.precision == Precision::Fp16 ? Math::Fp16
                                            : Math::Tf32;
  s.deterministic = o.deterministic;
  return s;
}

int select(dist::ProcessContext& ctx) { return device::select_gpu(ctx.local_rank()); }

class GpuEngine final : public Engine {
 public:
  GpuEngine(std::unique_ptr<nn::Model<float>> model, std::unique_ptr<optim::Sgd<float>> sgd,
            dist::ProcessContext& ctx, const EngineSpec& o)
      : owned_model_(std::move(model)),
        owned_sgd_(std::move(sgd)),
        model_(*owned_model_),
        sgd_(*owned_sgd_),
        gpu_(select(ctx)),
        context_(settings_of(o)),
        net_(context_, model_),
        sgd_gpu_(sgd_),
        precision_(name_of(kPrecisionNames, o.precision)),
        deterministic_(o.deterministic),
        scaled_(o.precision == Precision::Fp16) {
    kernels::batch_norm_tuning();  // HPCTRAIN_BN_TUNING read now: a malformed one stops the run before its set-up
    if (ctx.world_size() > 1 || nccl_forced()) {
      nccl_ = std::make_unique<dist::NcclCommunicator>(ctx.world());
      buckets_ = std::make_unique<NcclBuckets>(*nccl_, net_);
      bucketer_ = std::make_unique<dist::GradientBucketer>(
          *nccl_, net_.arenas().grads().data<float>(), net_.arenas().grads().numel(), model_.gradient_groups(),
          static_cast<int64_t>(o.bucket_mb * 1024 * 1024), o.overlap, buckets_.get());
    }
    // Graphs by default (--cuda-graphs auto) on one rank without NCCL; with NCCL (several ranks,
    // or the test hook) only when asked for (on): its all-reduces are then captured inside the
    // step's graph, which no run on several GPUs has yet shown to hold.
    graphs_by_default_ = o.cuda_graphs == CudaGraphs::Auto && !nccl_;
    graphs_ = o.cuda_graphs == CudaGraphs::On || graphs_by_default_;
    if (graphs_ && nccl_) {
      int version = 0;
      ncclGetVersion(&version);
      HPC_REQUIRE(version >= 20906, "--cuda-graphs with several ranks captures NCCL's all-reduces, which needs NCCL "
                                    "2.9.6 or later (this is ", version, "); leave out --cuda-graphs");
    }
    if (graphs_) hyper_ = Tensor(Shape{2}, DType::F32, DeviceKind::CUDA);
    if (scaled_) scaler_ = first_loss_scaler();
    overflow_ = static_cast<int*>(overflow_pinned_.get(sizeof(int)));
    *overflow_ = 0;
    upload();
  }

  StepResult train_step(const data::Batch& batch, float share, double lr, double momentum) override {
    host_current_ = false;
    stage(batch);
    return graphs_ ? graph_step(batch, share, lr, momentum) : eager_step(batch, share, lr, momentum);
  }

  // One step of the staged batch, enqueued and waited for.
  StepResult eager_step(const data::Batch& batch, float share, double lr, double momentum) {
    replayed_ = false;
    StepResult r;
    begin_reduction(share);
    enqueue_step(lr, momentum, &r);
    return finish_step(batch, r);
  }

  // Forward, loss, backward, the gradients' reduction and the update, enqueued on the compute
  // stream (hyper: device {lr, momentum} for a step being captured). comm_wait goes into *r.
  void enqueue_step(double lr, double momentum, StepResult* r, const float* hyper = nullptr) {
    if (scaled_) {
      context_.set_loss_scale(static_cast<float>(scaler_.scale()));
      CUDA_CHECK(cudaMemsetAsync(context_.non_finite(), 0, sizeof(int), context_.stream()));
    }
    // Host-side times (StepPhases): when the kernels were enqueued. A step being captured runs
    // later, at each replay: it leaves them unset.
    StepPhases t;
    t.forward = StepPhases::Clock::now();
    net_.loss(net_.forward(x_, true), labels_.data<int32_t>());
    t.backward = StepPhases::Clock::now();
    // The ranks' batch-norm running statistics averaged (as the CPU engine does): behind the
    // forward that updated them, on the NCCL stream ahead of the gradients' buckets.
    if (Tensor& stats = net_.arenas().buffers(); bucketer_ && stats.numel() > 0)
      bucketer_->average(stats.data<float>(), stats.numel());
    // With NCCL the buckets land the 16-bit weight gradients, each what is deferred before its
    // all-reduce: the only landing, so that one a bucket missed would show (a one-rank average
    // changes nothing, and a landing at the backward's end would hide it from the one-GPU test).
    net_.backward(
        [&](int64_t offset) {
          if (bucketer_) bucketer_->ready_from(offset);
        },
        /*land=*/!bucketer_);
    t.backward_end = StepPhases::Clock::now();
    r->comm_wait = bucketer_ ? bucketer_->finish() : 0.0;  // 0: the device waits, not the host
    HPC_CHECK(!net_.arenas().has_deferred(), "16-bit weight gradients deferred after the step's last bucket was "
              "enqueued: never landed in the fp32 arena");
    auto& a = net_.arenas();
    // fp16: the summed gradients (every rank holds the same, so every rank decides alike) are
    // checked in one pass; when one is not finite the update kernel changes nothing.
    if (scaled_)
      kernels::scale_and_check(a.grads().data<float>(), a.grads().numel(), 1.0f, context_.non_finite(),
                               context_.stream());
    if (!hyper) wait_for_snapshot_copy();  // a captured step waits at its launch instead
    t.optimizer = StepPhases::Clock::now();
    sgd_gpu_.step(a.values().data<float>(), a.grads().data<float>(), lr, momentum, context_.stream(),
                  scaled_ ? context_.non_finite() : nullptr, hyper);
    t.end = StepPhases::Clock::now();
    if (!hyper) r->phases = t;
    if (scaled_)  // into pinned memory: a captured copy may not touch pageable memory
      CUDA_CHECK(cudaMemcpyAsync(overflow_, context_.non_finite(), sizeof(int), cudaMemcpyDeviceToHost,
                                 context_.stream()));
  }

  // Waits for the step and reads its loss, correct count and (fp16) overflow flag back.
  StepResult finish_step(const data::Batch& batch, StepResult r) {
    const auto sums = net_.sums();  // waits for the stream: overflow_ is in place
    if (scaled_) r.skipped = !scaler_.update(*overflow_ == 0);
    r.loss = sums.loss / static_cast<double>(std::max<int64_t>(batch.size(), 1));
    r.correct = sums.correct;
    return r;
  }

  // CUDA graphs (one rank). A captured graph holds the addresses of every buffer the step
  // touches; they stay put while the batch shape stays and nothing else resizes them. So: a
  // step with a new shape, or the first after an evaluation (whose batches may have grown the
  // buffers), runs eagerly and settles the allocations; the next one of that shape is captured
  // (and then replayed, which runs it), and later ones replay. lr and momentum reach the update
  // kernel through device memory uploaded before each launch; train_step has staged the batch,
  // into the same device buffers. fp16: the graph holds the loss scale it was captured with
  // (the kernels and cuDNN take it as an argument) and the whole rest of the scaling: the
  // check of the gradients, the update that changes nothing after an overflow, the flag's copy
  // into pinned memory that finish_step reads; when the scaler changes the scale (an overflow
  // halves it, 2000 good steps double it) the next step is captured again, which costs one
  // capture a change, not an eager step.
  //
  // With NCCL (several ranks, --cuda-graphs): the bucketer hands each bucket to the NCCL stream
  // from this thread as the backward pass is enqueued (a fence event of the compute stream, the
  // all-reduce, the join), so the capture forks onto the NCCL stream and joins back, and the
  // graph holds the all-reduces in their order; every rank captures and replays at the same
  // steps (the same shapes), and eager and replayed steps issue the same collectives in the same
  // order. A replayed step leaves the bucket timeline empty (no host enqueues a bucket).
  StepResult graph_step(const data::Batch& batch, float share, double lr, double momentum) {
    if (!graphable(share)) {  // (every rank alike: the sampler gives all the same share)
      // Its shape may differ (a last, smaller batch), and its plans may grow a buffer the graph
      // points at (cuDNN's workspace): the graph is dropped and the next step settles again.
      forget_graph();
      return eager_step(batch, share, lr, momentum);
    }
    const bool same_shape = x_.shape() == graph_shape_;
    if (graph_ && scaled_ && graph_scale_ != scaler_.scale()) graph_.reset();
    if (!same_shape || !settled_) {  // eager, and the buffers settle for this shape
      graph_.reset();
      graph_shape_ = x_.shape();  // staged: the batch's (decoded batches have no images)
      settled_ = true;
      return eager_step(batch, share, lr, momentum);
    }
    StepResult r;
    hyper_host_[0] = static_cast<float>(lr);
    hyper_host_[1] = static_cast<float>(momentum);
    CUDA_CHECK(cudaMemcpyAsync(hyper_.raw(), hyper_host_, sizeof hyper_host_, cudaMemcpyHostToDevice,
                               context_.stream()));
    if (!graph_) {
      try {
        capture(share, lr, momentum, &r);
      } catch (const std::exception& e) {
        // By default (auto) a step that cannot be captured (a library call some driver or
        // version refuses in a capture) is no reason to stop a run: nothing of it ran, so the
        // steps go on eagerly from this one, with the same bits. Asked for, it is an error.
        if (!graphs_by_default_) throw;
        cudaGetLastError();  // the capture's error, not sticky: not the next launch's
        log::warn("CUDA graphs: the training step could not be captured (", e.what(),
                  "); the steps run without graphs from here on (--no-cuda-graphs chooses that up front)");
        graphs_ = false;
        return eager_step(batch, share, lr, momentum);
      }
    }
    wait_for_snapshot_copy();
    replayed_ = true;
    CUDA_CHECK(cudaGraphLaunch(graph_->exec(), context_.stream()));
    return finish_step(batch, r);
  }

  // Evaluation may resize the buffers a captured step points at: every rank drops its graph,
  // and the next step runs eagerly and settles them. Here, not in eval_batch: a rank with no
  // test batch (fewer batches than ranks) would keep its graph and replay while the others ran
  // eagerly and captured, their NCCL calls out of step (a capture's buffer registration waits
  // for the node's other ranks: a hang).
  void begin_evaluation() override { forget_graph(); }

  void forget_graph() {
    settled_ = false;
    graph_.reset();
  }

  void eval_batch(const data::Batch& batch, double* sums) override {
    stage(batch);
    net_.loss(net_.forward(x_, false), labels_.data<int32_t>());
    const auto s = net_.sums();
    sums[0] += s.loss;
    sums[1] += static_cast<double>(s.correct);
  }

  // Through the host mirror: downloaded once after the last step (a snapshot after the state
  // check reads the same copy), uploaded whole on restore.
  void snapshot(ckpt::Checkpoint& c) override {
    download();
    copy_state(c, model_, sgd_);
    if (scaled_) record_loss_scaler(c, scaler_.state());
  }

  // The parameters and momentum through pinned memory on the side stream (see the top).
  void begin_snapshot(ckpt::Checkpoint& c) override {
    complete_snapshot();  // one in flight at a time: the pinned copy is reused
    std::lock_guard lock(deferred_mu_);
    const Tensor &values = net_.arenas().values(), &velocity = sgd_gpu_.velocity(),
                 &buffers = net_.arenas().buffers();
    // The forward of the next step changes the batch-norm statistics: they are copied now (the
    // compute stream is idle at a step boundary; a few kilobytes).
    c.buffers.resize(static_cast<size_t>(buffers.numel()));
    if (buffers.numel()) device::copy(c.buffers.data(), buffers.raw(), buffers.bytes(), device::Copy::DeviceToHost);
    if (scaled_) record_loss_scaler(c, scaler_.state());
    char* pinned = static_cast<char*>(snapshot_pinned_.get(values.bytes() + velocity.bytes()));
    CUDA_CHECK(cudaEventRecord(boundary_.get(), context_.stream()));
    CUDA_CHECK(cudaStreamWaitEvent(side_.get(), boundary_.get(), 0));
    CUDA_CHECK(cudaMemcpyAsync(pinned, values.raw(), values.bytes(), cudaMemcpyDeviceToHost, side_.get()));
    CUDA_CHECK(cudaMemcpyAsync(pinned + values.bytes(), velocity.raw(), velocity.bytes(), cudaMemcpyDeviceToHost,
                               side_.get()));
    CUDA_CHECK(cudaEventRecord(copied_.get(), side_.get()));
    update_waits_ = true;
    c.params.resize(static_cast<size_t>(values.numel()));
    c.momentum.resize(static_cast<size_t>(velocity.numel()));
    deferred_ = Deferred{pinned, c.params.data(), values.bytes(), c.momentum.data(), velocity.bytes()};
  }

  // On the snapshot writer's thread (or before anything that replaces the state).
  void complete_snapshot() override {
    std::lock_guard lock(deferred_mu_);
    if (!deferred_) return;
    const Deferred d = *std::exchange(deferred_, std::nullopt);
    CUDA_CHECK(cudaSetDevice(gpu_));  // a thread's current device is its own
    CUDA_CHECK(cudaEventSynchronize(copied_.get()));
    std::memcpy(d.params, d.pinned, d.param_bytes);
    std::memcpy(d.momentum, d.pinned + d.param_bytes, d.momentum_bytes);
  }

  void restore(const ckpt::Checkpoint& c) override {
    complete_snapshot();  // the side stream's copy reads the arenas restore replaces
    load_state(c, model_, sgd_);
    upload();
    if (const std::optional<optim::LossScalerState> s = loss_scaler_of(c)) scaler_ = optim::LossScaler(*s);
  }

  std::optional<StatePart> first_non_finite() override {
    download();
    return train::first_non_finite(model_, sgd_);
  }

  const dist::BucketTimeline& timeline() const override {
    static const dist::BucketTimeline kNone;  // one GPU: nothing reduced; a replayed graph: no host times
    return bucketer_ && !replayed_ ? bucketer_->last_timeline() : kNone;
  }
  size_t bucket_count() const override { return bucketer_ ? bucketer_->bucket_count() : 0; }
  std::string async_error() override { return nccl_ ? nccl_->async_error() : std::string(); }
  size_t peak_device_memory() const override { return device::peak_memory_in_use(); }

  std::string describe() const override {
    cudaDeviceProp p{};
    CUDA_CHECK(cudaGetDeviceProperties(&p, gpu_));
    int nccl = 0;
    ncclGetVersion(&nccl);
    const std::string reduction = !nccl_              ? "no NCCL (one GPU)"
                                  : nccl_->size() > 1 ? detail::concat("NCCL ", nccl)
                                                      : detail::concat("NCCL ", nccl, " forced at world size 1");
    return detail::concat("GPU ", gpu_, " (", p.name, ", ", p.totalGlobalMem >> 20, " MiB), ", precision_,
                          deterministic_ ? ", deterministic" : ", non-deterministic",
                          graphs_ ? ", CUDA graphs" : "", ", cuDNN ", cudnnGetVersion(), ", ", reduction);
  }

 private:
  // The step captured into graph_ (none on failure: the stream's capture is ended, whatever
  // failed, and the error thrown). Thread-local capture: other threads (NCCL's proxy) may make
  // CUDA calls of their own meanwhile; the loader's, which may free memory (a device-wide
  // synchronisation), wait for its end (device::exclude_capture).
  void capture(float share, double lr, double momentum, StepResult* r) {
    cudaStream_t s = context_.stream();
    const auto excluded = device::exclude_capture();
    CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    cudaGraph_t g = nullptr;
    try {
      HPC_CHECK(!capture_fails_for_test(), "HPCTRAIN_TEST_FAIL_CAPTURE=1");
      begin_reduction(share);
      enqueue_step(lr, momentum, r, hyper_.data<float>());
    } catch (...) {
      cudaStreamEndCapture(s, &g);
      if (g) cudaGraphDestroy(g);
      net_.arenas().forget_deferred();  // the captured backward's, which never ran
      throw;
    }
    CUDA_CHECK(cudaStreamEndCapture(s, &g));
    graph_ = std::make_unique<Graph>(g);
    graph_scale_ = scaler_.scale();
    if (++captures_ == 1) log::info("CUDA graph: the training step captured (batch ", graph_shape_.str(), ")");
  }

  // Whether a step with this share may be captured: no reduction (one GPU, share 1), or NCCL's
  // average (every rank's share 1/size). A pre-multiplied sum (unequal shares) names an operator
  // made and destroyed around each call, which a replayed graph would outlive: those steps run
  // eagerly.
  bool graphable(float share) const {
    return bucketer_ ? dist::even_share(share, nccl_->size()) : share == 1.0f;
  }

  // A new step's reduction: this rank's share of the global batch (1 on one GPU).
  void begin_reduction(float share) {
    if (bucketer_) bucketer_->begin_step(share);
    else HPC_CHECK(share == 1.0f, "a share of ", share, " of the global batch on the only GPU");
  }

  // The next update waits for the side stream's copy of a snapshot begun before it.
  void wait_for_snapshot_copy() {
    if (!std::exchange(update_waits_, false)) return;
    CUDA_CHECK(cudaStreamWaitEvent(context_.stream(), copied_.get(), 0));
  }

  // The host mirror to the device (once the compute stream has nothing in flight that uses the
  // arenas: before the first step), and back after the steps so far.
  void upload() {
    context_.synchronize();
    net_.upload(model_.params());
    sgd_gpu_.upload(sgd_);
    host_current_ = true;
  }
  void download() {
    if (host_current_) return;
    context_.synchronize();
    net_.download(model_.params());
    sgd_gpu_.download(sgd_);
    host_current_ = true;
  }

  // The batch onto the device: its images as they come (bytes, cropped, flipped and normalised
  // here by the assembler's crops and table; or floats) and its labels. Images in page-locked
  // memory (the loader's batches of bytes) are copied from where they are, others through the
  // pinned buffer, after the labels and crops. The step ends with a wait for the stream, so the
  // copies are done before the loader reuses them.
  void stage(const data::Batch& batch) {
    if (batch.decoded) return stage_decoded(batch);
    const bool bytes = batch.images.dtype() == DType::U8, direct = batch.images.pinned();
    HPC_CHECK(!bytes || batch.table, "a batch of bytes without its normalisation table");
    HPC_CHECK(batch.crops.empty() || (bytes && static_cast<int64_t>(batch.crops.size()) == batch.size()),
              "a batch with ", batch.crops.size(), " crops for ", batch.size(), " samples");
    const size_t image_bytes = batch.images.bytes(), label_bytes = batch.labels.size() * sizeof(int32_t),
                 crop_bytes = batch.crops.size() * sizeof(data::CropFlip), head = label_bytes + crop_bytes;
    auto* pinned = static_cast<char*>(pinned_.get((direct ? 0 : image_bytes) + head));
    const void* images = direct ? batch.images.raw() : pinned + head;
    std::memcpy(pinned, batch.labels.data(), label_bytes);
    if (crop_bytes) std::memcpy(pinned + label_bytes, batch.crops.data(), crop_bytes);
    if (!direct) std::memcpy(pinned + head, batch.images.raw(), image_bytes);
    nn::cuda::ensure(x_, batch.images.shape());
    nn::cuda::ensure(labels_, Shape{batch.size()}, DType::I32);
    CUDA_CHECK(cudaMemcpyAsync(labels_.raw(), pinned, label_bytes, cudaMemcpyHostToDevice, context_.stream()));
    if (!bytes) {
      CUDA_CHECK(cudaMemcpyAsync(x_.raw(), images, image_bytes, cudaMemcpyHostToDevice, context_.stream()));
      return;
    }
    if (*batch.table != table_host_) {  // once per run (and when evaluation's differs)
      table_host_ = *batch.table;
      table_ = Tensor(Shape{static_cast<int64_t>(table_host_.size())}, DType::F32, DeviceKind::CUDA);
      CUDA_CHECK(cudaMemcpyAsync(table_.raw(), table_host_.data(), table_.bytes(), cudaMemcpyHostToDevice,
                                 context_.stream()));
    }
    nn::cuda::ensure(x_bytes_, batch.images.shape(), DType::U8);
    CUDA_CHECK(cudaMemcpyAsync(x_bytes_.raw(), images, image_bytes, cudaMemcpyHostToDevice, context_.stream()));
    const Shape& s = batch.images.shape();
    if (crop_bytes == 0) {
      kernels::normalize_u8(x_bytes_.data<uint8_t>(), x_.data<float>(), x_.numel(), static_cast<int>(s[3]),
                            table_.data<float>(), context_.stream());
      return;
    }
    nn::cuda::ensure(crops_, Shape{batch.size(), 3}, DType::I32);
    CUDA_CHECK(cudaMemcpyAsync(crops_.raw(), pinned + label_bytes, crop_bytes, cudaMemcpyHostToDevice,
                               context_.stream()));
    kernels::crop_flip_normalize_u8(x_bytes_.data<uint8_t>(), crops_.data<int32_t>(), x_.data<float>(), s[0], s[1],
                                    s[2], static_cast<int>(s[3]), table_.data<float>(), context_.stream());
  }

  // A batch the loader's GPU decoder made (train/engine/gpu_decoder.cpp): its images are complete in the
  // decoder's device memory (the decoder waited for them), copied from there into x_, which a
  // captured graph reads; the copy is done when the step ends (it waits for the stream), before
  // the loader reuses the batch.
  void stage_decoded(const data::Batch& batch) {
    const int64_t side = batch.jpeg_side;
    nn::cuda::ensure(x_, Shape{batch.size(), side, side, 3});
    nn::cuda::ensure(labels_, Shape{batch.size()}, DType::I32);
    const size_t label_bytes = batch.labels.size() * sizeof(int32_t);
    auto* pinned = static_cast<char*>(pinned_.get(label_bytes));
    std::memcpy(pinned, batch.labels.data(), label_bytes);
    CUDA_CHECK(cudaMemcpyAsync(labels_.raw(), pinned, label_bytes, cudaMemcpyHostToDevice, context_.stream()));
    CUDA_CHECK(cudaMemcpyAsync(x_.raw(), batch.decoded, x_.bytes(), cudaMemcpyDeviceToDevice, context_.stream()));
  }

  std::unique_ptr<nn::Model<float>> owned_model_;
  std::unique_ptr<optim::Sgd<float>> owned_sgd_;
  nn::Model<float>& model_;  // the host mirror
  optim::Sgd<float>& sgd_;
  bool host_current_ = true;  // whether the mirror holds the state after the last step
  int gpu_;
  nn::cuda::GpuContext context_;
  nn::cuda::GpuNetwork net_;
  optim::SgdCuda sgd_gpu_;
  // Several ranks (or HPCTRAIN_TEST_FORCE_NCCL=1): the communicator, the bucketer's device and
  // the bucketer, destroyed in the reverse order; else none of them.
  std::unique_ptr<dist::NcclCommunicator> nccl_;
  std::unique_ptr<NcclBuckets> buckets_;
  std::unique_ptr<dist::GradientBucketer> bucketer_;
  std::string precision_;
  bool deterministic_;
  bool scaled_;  // fp16: dynamic loss scaling
  bool graphs_ = false;  // CUDA graphs (--cuda-graphs, or auto with one rank)
  bool graphs_by_default_ = false;  // auto took them: a failed capture falls back to eager steps
  std::unique_ptr<Graph> graph_;
  Shape graph_shape_;
  double graph_scale_ = 0;  // fp16: the loss scale graph_ was captured with
  bool replayed_ = false;   // the last step was a graph's launch
  bool settled_ = false;
  Tensor hyper_;  // device {lr, momentum} of a replayed step
  float hyper_host_[2] = {0, 0};
  int64_t captures_ = 0;
  optim::LossScaler scaler_;
  PinnedBuffer overflow_pinned_;
  int* overflow_ = nullptr;  // fp16: the step's non-finite flag, copied back (pinned)
  PinnedBuffer pinned_;
  // In-memory snapshots: the side stream, the boundary and copy events, the pinned copy, and
  // where the snapshot begun last wants its parameters and momentum (until completed).
  CudaStream side_;
  CudaEvent boundary_, copied_;
  PinnedBuffer snapshot_pinned_;
  bool update_waits_ = false;
  struct Deferred {
    const char* pinned;
    float* params;
    size_t param_bytes;
    float* momentum;
    size_t momentum_bytes;
  };
  std::mutex deferred_mu_;
  std::optional<Deferred> deferred_;
  Tensor x_, labels_, x_bytes_, table_, crops_;  // crops_: the batch's data::CropFlip
  std::vector<float> table_host_;  // what table_ holds
};

}  // namespace

bool gpu_training_available(std::string* why) {
  if (device::cuda_device_count() > 0) return true;
  if (why) *why = "no CUDA GPU is visible (" + device::describe() + ")";
  return false;
}

std::string gpu_kernels(int local_rank) {
  const int n = device::cuda_device_count();
  if (n == 0) return "";
  // Called by every rank before an all-gather: a failure here is said by the engine's own calls
  // later, with every rank's error handling; here it only leaves the GPU's part out.
  cudaDeviceProp p{};
  int runtime = 0;
  if (cudaGetDeviceProperties(&p, local_rank % n) != cudaSuccess ||  // the GPU select_gpu takes
      cudaRuntimeGetVersion(&runtime) != cudaSuccess) {
    cudaGetLastError();
    return detail::concat("a GPU whose properties could not be read, cuDNN ", cudnnGetVersion());
  }
  return detail::concat(p.name, " (sm_", p.major, p.minor, "), CUDA ", runtime, ", cuDNN ", cudnnGetVersion());
}

std::unique_ptr<Engine> make_gpu_engine(std::unique_ptr<nn::Model<float>> model, std::unique_ptr<optim::Sgd<float>> sgd,
                                        dist::ProcessContext& ctx, const EngineSpec& spec) {
  return std::make_unique<GpuEngine>(std::move(model), std::move(sgd), ctx, spec);
}

}  // namespace hpc::train

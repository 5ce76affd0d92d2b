// The CPU engine: nn::Model and optim::Sgd in host memory, gradients all-reduced over MPI by
// the GradientBucketer while backward runs.
#include <algorithm>
#include <cstring>
#include <mutex>
#include <optional>

#include "nn/gemm.hpp"
#include "train/engine/engine.hpp"

namespace hpc::train {
namespace {

class CpuEngine final : public Engine {
 public:
  CpuEngine(std::unique_ptr<nn::Model<float>> model, std::unique_ptr<optim::Sgd<float>> sgd,
            dist::Communicator& comm, const EngineSpec& o)
      : owned_model_(std::move(model)),
        owned_sgd_(std::move(sgd)),
        model_(*owned_model_),
        sgd_(*owned_sgd_),
        threads_(o.threads),
        statistics_(model_.params().buffers()),
        // At one rank too: there the average changes nothing (each rank's share is 1, nothing is
        // all-reduced), but it goes through the communication thread as it does on several ranks,
        // so that a one-rank run's timeline holds the call (bench/scaling_model.py's input).
        average_statistics_(!o.sync_batch_norm && statistics_.numel() > 0),
        bucketer_(comm, model_.params().grads().data<float>(), model_.params().grads().numel(),
                  model_.gradient_groups(), static_cast<int64_t>(o.bucket_mb * 1024 * 1024), o.overlap) {}

  StepResult train_step(const data::Batch& batch, float share, double lr, double momentum) override {
    StepResult r;
    StepPhases& t = r.phases;
    bucketer_.begin_step(share);
    t.forward = bucketer_.last_timeline().start;  // the bucket timeline's zero
    r.loss = model_.loss(model_.forward(batch.images, true), batch.labels.data());
    t.backward = StepPhases::Clock::now();
    if (average_statistics_) bucketer_.average(statistics_.data<float>(), statistics_.numel());
    model_.backward([&](int64_t offset) { bucketer_.ready_from(offset); });
    t.backward_end = StepPhases::Clock::now();
    r.comm_wait = bucketer_.finish();
    r.correct = count_correct(model_.probabilities(), batch.labels.data());
    complete_snapshot();  // the update changes what a snapshot begun before this step copies
    t.optimizer = StepPhases::Clock::now();
    sgd_.step(model_.params(), lr, momentum);
    t.end = StepPhases::Clock::now();
    return r;
  }

  void eval_batch(const data::Batch& batch, double* sums) override { eval_batch_cpu(model_, batch, sums); }

  void snapshot(ckpt::Checkpoint& c) override { copy_state(c, model_, sgd_); }
  void restore(const ckpt::Checkpoint& c) override {
    complete_snapshot();
    load_state(c, model_, sgd_);
  }

  void begin_snapshot(ckpt::Checkpoint& c) override {
    complete_snapshot();  // one in flight at a time
    std::lock_guard lock(deferred_mu_);
    const Tensor& buffers = model_.params().buffers();
    const float* b = buffers.numel() ? buffers.data<float>() : nullptr;
    c.buffers.assign(b, b + buffers.numel());
    c.params.resize(static_cast<size_t>(model_.params().values().numel()));
    c.momentum.resize(static_cast<size_t>(sgd_.momentum_buffer().numel()));
    deferred_ = Deferred{c.params.data(), c.momentum.data()};
  }

  void complete_snapshot() override {
    std::lock_guard lock(deferred_mu_);
    if (!deferred_) return;
    const Tensor &values = model_.params().values(), &velocity = sgd_.momentum_buffer();
    if (values.numel()) std::memcpy(deferred_->params, values.raw(), values.bytes());
    if (velocity.numel()) std::memcpy(deferred_->momentum, velocity.raw(), velocity.bytes());
    deferred_.reset();
  }

  std::optional<StatePart> first_non_finite() override { return train::first_non_finite(model_, sgd_); }
  const dist::BucketTimeline& timeline() const override { return bucketer_.last_timeline(); }
  size_t bucket_count() const override { return bucketer_.bucket_count(); }
  std::string describe() const override {
    return "CPU, " + std::to_string(threads_) + " thread(s) per rank, GEMM " + nn::gemm_backend();
  }

 private:
  std::unique_ptr<nn::Model<float>> owned_model_;
  std::unique_ptr<optim::Sgd<float>> owned_sgd_;
  nn::Model<float>& model_;
  optim::Sgd<float>& sgd_;
  int threads_;
  // Each rank's forward moves its batch-norm running statistics towards its own batch's; with
  // several ranks their mean is what every rank keeps (timm's --dist-bn reduce, after every
  // step), reduced by the bucketer behind the backward pass. So all ranks evaluate with the
  // statistics the state holds, a checkpoint (rank 0's) evaluates as the run did, and a resumed
  // run as an uninterrupted one; training itself is untouched. Not needed with
  // --sync-batch-norm, whose batch statistics are already the whole global batch's.
  Tensor& statistics_;
  bool average_statistics_;
  dist::GradientBucketer bucketer_;
  // A snapshot begun and not yet completed: where its parameters and momentum go.
  struct Deferred {
    float *params, *momentum;
  };
  std::mutex deferred_mu_;
  std::optional<Deferred> deferred_;
};

}  // namespace

int64_t count_correct(const Tensor& prob, const int32_t* labels) {
  const int64_t n = prob.shape()[0], k = prob.shape()[1];
  const float* p = prob.data<float>();
  int64_t correct = 0;
  for (int64_t r = 0; r < n; ++r) {
    const float* row = p + r * k;
    correct += (std::max_element(row, row + k) - row) == labels[r];
  }
  return correct;
}

void eval_batch_cpu(nn::Model<float>& model, const data::Batch& batch, double* sums) {
  for_each_forward_chunk(batch.images, [&](const Tensor& images, int64_t first, int64_t count) {
    const int32_t* labels = batch.labels.data() + first;
    sums[0] += model.loss(model.forward(images, false), labels) * static_cast<double>(count);
    sums[1] += static_cast<double>(count_correct(model.probabilities(), labels));
  });
}

EngineSpec engine_spec(const TrainOptions& o, int threads) {
  EngineSpec s;
  s.bucket_mb = o.bucket_mb;
  s.overlap = o.overlap;
  s.sync_batch_norm = o.sync_batch_norm;
  s.threads = threads;
  s.precision = o.precision;
  s.deterministic = o.deterministic;
  s.cuda_graphs = o.cuda_graphs;
  return s;
}

std::unique_ptr<Engine> make_cpu_engine(std::unique_ptr<nn::Model<float>> model, std::unique_ptr<optim::Sgd<float>> sgd,
                                        dist::Communicator& comm, const EngineSpec& spec) {
  return std::make_unique<CpuEngine>(std::move(model), std::move(sgd), comm, spec);
}

}  // namespace hpc::train

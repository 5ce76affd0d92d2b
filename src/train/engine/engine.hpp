// Where the training steps run. The loop in trainer.cpp is the same for every device; an
// Engine runs each step's forward, loss, backward, gradient all-reduce and update. Set-up
// initialises (or resumes) and broadcasts a host nn::Model and optim::Sgd; from then on the
// engine owns them and the whole training state: snapshot() copies it into a checkpoint and
// restore() takes it from one. The CPU engine trains the host model itself; the GPU engine
// (gpu_engine.cpp; gpu_engine_none.cpp in builds without CUDA and cuDNN) a device mirror, of
// which the host model is then only its copy for snapshots.
#pragma once

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "data/loader.hpp"
#include "dist/bucketer.hpp"
#include "ckpt/checkpoint.hpp"
#include "dist/process.hpp"
#include "nn/model.hpp"
#include "optim/loss_scaler.hpp"
#include "optim/sgd.hpp"
#include "train/engine/training_state.hpp"  // StatePart, and the state to and from a checkpoint
#include "train/options/train_options.hpp"

namespace hpc::train {

// When this rank's main thread ran each part of a step, for --timeline-file's trace
// (train/observe/trace.hpp): forward [forward, backward), backward [backward, backward_end) (its end is
// where the wait for the last buckets begins), the optimizer [optimizer, end). The GPU engine's
// are host-side times, when it enqueued the kernels (the device runs them later; the step's end
// waits for them); a replayed CUDA graph enqueues the whole step at once and leaves them unset.
struct StepPhases {
  using Clock = std::chrono::steady_clock;
  Clock::time_point forward, backward, backward_end, optimizer, end;
  bool known() const { return end != Clock::time_point{}; }
};

struct StepResult {
  double loss = 0;       // mean over this rank's batch
  int64_t correct = 0;   // this rank's right answers
  double comm_wait = 0;  // seconds spent waiting for the all-reduce after backward
  bool skipped = false;  // fp16: the gradients overflowed, the update was not applied
  StepPhases phases;
};

class Engine {
 public:
  virtual ~Engine() = default;
  // One training step on this rank's batch; share: its part of the global batch.
  virtual StepResult train_step(const data::Batch& batch, float share, double lr, double momentum) = 0;
  // Eval-mode forward: adds the batch's loss sum and correct count to sums[0] and sums[1].
  virtual void eval_batch(const data::Batch& batch, double* sums) = 0;
  // Called on every rank before an evaluation, also on a rank that gets no test batch (fewer
  // batches than ranks): whatever the evaluation may change, every rank forgets alike.
  virtual void begin_evaluation() {}
  // The training state into c: the parameters, optimizer state and batch-norm statistics into
  // its arenas (keeping their capacity), and in fp16 the loss scaler's keys into its meta (the
  // rest of which, the run's record, is record_run's).
  virtual void snapshot(ckpt::Checkpoint& c) = 0;
  // The same state, its largest parts copied off the step loop (in-memory snapshots every
  // step). begin_snapshot() fills c at once with what the next step's forward changes (the
  // batch-norm statistics; in fp16 the loss scaler's keys) and sizes its parameters and
  // momentum; complete_snapshot(), on any thread, copies those two in. They change only at the
  // next update, which waits for that copy first (CheckFreq's pipelined snapshot, FAST '21), so
  // c ends with exactly the state at this boundary, as snapshot() gives it. c's arrays must
  // stay where they are (moving c keeps them) until complete_snapshot() has returned.
  virtual void begin_snapshot(ckpt::Checkpoint& c) { snapshot(c); }
  virtual void complete_snapshot() {}
  // c's state becomes the engine's (a usage error when its arenas do not fit the model).
  virtual void restore(const ckpt::Checkpoint& c) = 0;
  // The first part of the state that holds a value that is not finite (checked before every
  // checkpoint and at the end).
  virtual std::optional<StatePart> first_non_finite() = 0;
  virtual const dist::BucketTimeline& timeline() const = 0;
  virtual size_t bucket_count() const = 0;
  // One line for the log: where the steps run and how.
  virtual std::string describe() const = 0;
  // Bytes of device memory at the high-water mark (0 on the CPU).
  virtual size_t peak_device_memory() const { return 0; }
  // An error the communication library reported asynchronously (NCCL: a peer died while the
  // device waits for its all-reduce), else empty. Polled by the step watchdog's thread.
  virtual std::string async_error() { return {}; }
};

// Counts the rows of probabilities (N x K) whose first largest entry is the label.
int64_t count_correct(const Tensor& probabilities, const int32_t* labels);
// Eval-mode forward of a host model: adds the batch's loss sum and correct count to sums[0..1].
void eval_batch_cpu(nn::Model<float>& model, const data::Batch& batch, double* sums);

// Samples an eval-mode forward of a host model takes at a time, whatever the batch (evaluation's
// and predict's): a 1000-sample batch (the default --eval-batch-size) has activations far beyond
// the caches (the cnn's first convolution writes 100 MB) and a first evaluation that page-faults
// and zero-fills some 200 MB per rank. On a 2-core AMD EPYC VM, one thread, the 10,000
// Fashion-MNIST test images took about 0.5 s less per evaluation in chunks of 64 than in one
// batch of 1000 (32 and 128 were close to 64, 16 slower).
inline constexpr int64_t kCpuForwardChunk = 64;
// fn(chunk, first, count) for each chunk of kCpuForwardChunk samples of an N x ... batch, in
// order: chunk is a view of images' samples first .. first + count - 1.
template <class Fn>
void for_each_forward_chunk(const Tensor& images, Fn&& fn) {
  const int64_t n = images.shape()[0], per_sample = n > 0 ? images.numel() / n : 0;
  for (int64_t first = 0; first < n; first += kCpuForwardChunk) {
    const int64_t count = std::min(kCpuForwardChunk, n - first);
    Shape shape = images.shape();
    shape[0] = count;
    fn(images.view(first * per_sample, std::move(shape)), first, count);
  }
}

// What an engine takes of a run's settings (engine_spec; the rest is the trainer's).
struct EngineSpec {
  double bucket_mb{};         // gradient all-reduce buckets (--bucket-mb)
  bool overlap{};             // buckets all-reduced during the backward pass
  bool sync_batch_norm{};     // CPU: batch statistics over all ranks
  int threads{};              // CPU: math-library threads
  Precision precision{};      // GPU: the math of products and the activations' type
  bool deterministic{};       // GPU: only algorithms that give the same bits every run
  CudaGraphs cuda_graphs{};   // GPU: steps replayed as one CUDA graph (auto: with one rank, no NCCL)
};
EngineSpec engine_spec(const TrainOptions& o, int threads);

// The engines take the model and optimizer over.
std::unique_ptr<Engine> make_cpu_engine(std::unique_ptr<nn::Model<float>> model, std::unique_ptr<optim::Sgd<float>> sgd,
                                        dist::Communicator& comm, const EngineSpec& spec);

// Whether this build and machine can train on a GPU; when not, *why says what is missing.
bool gpu_training_available(std::string* why);
// What this rank's GPU (its local rank's) computes with, as far as it sets the bits: its name and
// compute capability, the CUDA runtime's and cuDNN's versions ("" with no GPU).
std::string gpu_kernels(int local_rank);
// Selects this rank's GPU (its local rank) and mirrors model and sgd on it. Collective: the
// NCCL communicator is made from ctx's world.
std::unique_ptr<Engine> make_gpu_engine(std::unique_ptr<nn::Model<float>> model, std::unique_ptr<optim::Sgd<float>> sgd,
                                        dist::ProcessContext& ctx, const EngineSpec& spec);
// The loader's JPEG decoder on GPU `gpu` (--jpeg-decode; train/engine/gpu_decoder.cpp): nvJPEG, then the
// crop, flip and normalisation as one kernel. A usage error where nvJPEG cannot be loaded.
std::unique_ptr<data::BatchDecoder> make_gpu_decoder(int gpu);

}  // namespace hpc::train

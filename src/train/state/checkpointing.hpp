// The training loop's side of checkpoints: what goes into one (src/ckpt holds the format and
// the store), finding the one to resume from, and checking that it fits this run.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/checkpoint.hpp"
#include "core/file_identity.hpp"
#include "data/dataset.hpp"
#include "dist/process.hpp"
#include "nn/model.hpp"
#include "optim/sgd.hpp"
#include "train/engine/training_state.hpp"  // the engine's part of a checkpoint, which the run's record completes
#include "train/options/options.hpp"

namespace hpc::train {

// Where a run stands: the next step to run, as a position every world size understands
// (global steps of the global batch), and the samples consumed so far.
struct RunPosition {
  int64_t step = 0;           // global steps done
  int64_t epoch = 0;          // epoch of the next step
  int64_t step_in_epoch = 0;  // index of the next step within that epoch
  int64_t global_batch = 0;
  double samples_seen = 0;    // what the schedules are functions of
  // Inside an epoch (step_in_epoch > 0): the epoch's training sums so far on each rank, 3 a rank
  // (loss x samples, correct, samples), so that a run resumed here reports the epoch's loss and
  // accuracy over all of its steps, as an uninterrupted run does. Key epoch_train_sums, a JSON
  // array; empty at an epoch's start and in checkpoints written before 2026-12-04 (whose resumed
  // epoch reports its resumed steps only). Not part of the state: state_checksum leaves it out.
  std::vector<double> epoch_sums{};  // ({}: positions made from their first five fields need not name it)
  // Saved at an epoch's end (step_in_epoch 0) before that epoch was ended (its evaluation, line and
  // event, which come after the boundary's checkpoint and snapshot): epoch_sums then hold that
  // epoch's sums, and these the images and seconds of its steps in the run that saved it, so that a
  // run resumed here ends that epoch first, which a kill during its evaluation had lost for good.
  // Keys epoch_train_images and epoch_train_seconds, beside epoch_train_sums (since 2026-12-05).
  int64_t epoch_images{};
  double epoch_seconds{};

  // Whether the epoch before `epoch` was not ended when this position was saved (above).
  bool epoch_unended() const { return step_in_epoch == 0 && !epoch_sums.empty(); }

  // Where a run stands after global step `step`, whose index in `epoch` was `index`: at the
  // end of the epoch (steps_per_epoch steps) the next step opens the next epoch.
  static RunPosition after_step(int64_t step, int64_t epoch, int64_t index, int64_t steps_per_epoch,
                                int64_t global_batch, double samples_seen) {
    if (index + 1 < steps_per_epoch) return {step, epoch, index + 1, global_batch, samples_seen};
    return {step, epoch + 1, 0, global_batch, samples_seen};
  }
};

// Which model a checkpoint's arenas belong to: its name and layout signature (the names and
// shapes of every parameter and buffer), and the names of its outputs where the training data
// gave them (packed shards' classes; the other datasets' are fixed: data/facts.hpp).
struct ModelIdentity {
  std::string name, signature;
  std::string max_pools;  // nn::max_pools_text of the model: what the signature does not show
  std::vector<std::string> class_names;
  std::string training_set;  // training_set_digest of the data it trains on ("": none recorded)
  std::string kernels;       // run_kernels of the run that trains it ("": none recorded)
  static ModelIdentity of(const nn::Model<float>& model, std::vector<std::string> class_names = {},
                          std::string training_set = "");
};

// The training set as a resumed run depends on it: its count, sample shape and labels in their
// order (16 hex digits). Another dataset, the same images shuffled otherwise (packed again with
// another seed, or more images) or replaced files give another digest: a run resumed on them would
// not continue at the sample where it stopped.
std::string training_set_digest(const data::Dataset& train);
// Usage error when the checkpoint records a training set's digest (checkpoints since 2026-12-04) and
// `digest`, of the data from `source`, is another.
void require_same_training_set(const ckpt::Checkpoint& c, const std::string& digest, const std::string& source);

// What computes a run's bits beyond this binary, per rank (nn::cpu_kernels, or gpu_kernels on a
// GPU: libraries, their versions, the instruction set or GPU): each distinct one once, in the order
// of their first ranks, joined by " + ". Checkpoints record it (key "kernels", since 2026-12-06).
std::string run_kernels(const std::vector<std::string>& of_each_rank);
// The warning when the ranks compute with different kernels (each kind with its hosts): the run's
// bits then depend on where each rank runs. None when they agree.
std::optional<std::string> mixed_kernels_warning(const std::vector<std::string>& hosts,
                                                 const std::vector<std::string>& kernels);
// The warning when a checkpoint to resume records other kernels than the run's (`kernels`,
// run_kernels): the run continues from its state, but not on the bits a run never stopped would
// have had. None when they agree or the checkpoint records none.
std::optional<std::string> other_kernels_warning(const ckpt::Checkpoint& c, const std::string& kernels);

// A checkpoint is the run's record (its meta section: versions, model, time, world size,
// position, options and training set, written here) and the training state (the arenas, and the loss scaler's
// keys, which the Engine snapshots). record_run replaces c's meta.
void record_run(ckpt::Checkpoint& c, const TrainOptions& o, const ModelIdentity& model, int world,
                const RunPosition& at);
// The class names record_run wrote (key class_names, a JSON array; beside it classes_digest,
// data::class_names_digest of the names, for people and tools); nullopt in a checkpoint without
// them (of a dataset with fixed names, or written before 2026-11-26). A usage error when malformed.
std::optional<std::vector<std::string>> class_names_of(const ckpt::Checkpoint& c);
// Usage error when the checkpoint records class names and a dataset's `names` (from `source`, a
// packed dataset's directory) are other ones: its labels would mean other classes. `hint` ends
// the message.
void require_same_classes(const ckpt::Checkpoint& c, const std::vector<std::string>& names, const std::string& source,
                          const std::string& hint = "");
// Only the parts of the record that change during a run: the time and the position (for a
// meta record_run made earlier in the same run, as snapshots reuse theirs).
void record_position(ckpt::Checkpoint& c, const RunPosition& at);

// What copy_fitting_state took from a model: how many of the other model's parameter and buffer
// tensors, and the names of those it left as they were (no tensor of that name and shape there).
struct FittingState {
  int64_t copied = 0, total = 0;
  std::vector<std::string> left;  // in the model's order, parameters first
};
// `from`'s parameters and batch-norm statistics into `to`, tensor by tensor where the names and
// shapes match (--init-from: a checkpoint's model into this run's, whose output layer may be for
// other classes, or whose stem another image size made the ImageNet or the CIFAR one). Names are
// compared with each layer index counted without the max-pool layers before it, so that the layers
// after a stem's pool meet their peers in a network without one.
FittingState copy_fitting_state(const nn::Model<float>& from, nn::Model<float>& to);

// A whole checkpoint of a host model and optimizer (tests, benchmarks).
ckpt::Checkpoint make_checkpoint(const TrainOptions& o, const nn::Model<float>& model, const optim::Sgd<float>& sgd,
                                 int world, const RunPosition& at);

// The hash of the parameters alone (the done line's param_checksum, as it has always been).
std::string param_checksum(const ckpt::Checkpoint& c);
// A hash of everything that decides the rest of a run: the parameters, the optimizer's momentum,
// the batch-norm statistics, the loss scaler and the position (step, epoch, step in the epoch,
// global batch, samples seen); not the options (check_resumable compares those), the time or the
// world size. A resumed run ends with the state_checksum of one never interrupted.
std::string state_checksum(const ckpt::Checkpoint& c);

// The checkpoint --resume asks for, read and verified by rank 0 and handed to every rank, or
// nullopt for a fresh start. Sets *path to where it came from.
std::optional<ckpt::Checkpoint> find_resume(const TrainOptions& o, dist::ProcessContext& ctx, std::string* path);

// What `read` finds on rank 0 (a checkpoint and its path, or nothing), on every rank: rank 0
// reads and verifies, the others receive its verdict (an error in `read` is every rank's
// error) and the bytes.
using CheckpointReader = std::function<std::optional<std::pair<std::string, ckpt::Checkpoint>>()>;
// Rank root's checkpoint (or its nullopt) and its *path, on every rank: the same bytes.
std::optional<ckpt::Checkpoint> share_checkpoint(dist::Communicator& comm, std::optional<ckpt::Checkpoint> c, int root,
                                                 std::string* path);
std::optional<ckpt::Checkpoint> read_on_rank0(dist::ProcessContext& ctx, const CheckpointReader& read,
                                              std::string* path);

// The newest valid checkpoint when `path` is a directory, else that file (usage error when
// there is none or it is damaged).
std::pair<std::string, ckpt::Checkpoint> load_checkpoint_or_latest(const std::string& path);

// The model a checkpoint holds, for a dataset of this sample shape and number of classes.
nn::ModelSpec model_spec_of(const ckpt::Checkpoint& c, const data::Dataset& ds);

// Usage error unless the checkpoint's parameters fit `model` (same name and layout) and mean the
// same function there (the same max pools; a checkpoint from before they were recorded: no
// padded one, as resnet18/50's ImageNet stem has since it became torchvision's). A checkpoint of
// that stem as it was before (its 2x2/2 pool fused into the batch norm, a layout of its own) is
// refused saying so, not as a model of another variant or shape.
void check_model(const ckpt::Checkpoint& c, const nn::Model<float>& model);

// The position a checkpoint records, and its loss scale, checked (a usage error when either is
// missing or invalid): what any resume of it needs, whatever the run.
RunPosition recorded_position(const ckpt::Checkpoint& c);
// Usage error unless the checkpoint's optimizer state (the momentum) has a value per parameter.
void check_optimizer_state(const ckpt::Checkpoint& c);

// The position a checkpoint resumes at. Throws a usage error naming the first difference when
// it belongs to another model or to options that change what is computed, or when its position
// or loss scale is invalid. `training_samples`: the count of the training set this run loaded
// (--train-samples 0, or N at or above the set's count, both mean all of it: a checkpoint that
// records one resumes with the other; hpctrain before 2026-12-04 took and recorded N above it).
RunPosition check_resumable(const ckpt::Checkpoint& c, const TrainOptions& o, const nn::Model<float>& model,
                            int64_t training_samples);

// Usage error unless a resumed position lies in a run of `epochs` epochs of `steps_per_epoch`
// steps: a hand-made checkpoint's position past the run's end would end it at once, untrained.
void require_position_in_run(const RunPosition& at, int64_t steps_per_epoch, int64_t epochs);

}  // namespace hpc::train

// The set-up phase of a training run, before its first step, in the order trainer.cpp runs it:
//   1. every rank was started with the same options (require_same_options);
//   2. each rank picks its device and math threads, loads the dataset and builds the model
//      (load_data_and_model);
//   3. the state to start from: rank 0 initialises the model, broadcasts it and every rank
//      proves it holds the same bytes; or every rank receives rank 0's checkpoint to resume from
//      and checks that it fits (resume_or_initialise), for the engine to restore.
// Each part is collective: an error on one rank (a file missing on one host) is every rank's
// (dist::collectively). A stop asked for on any rank meanwhile ends the run at the end of the
// part it came in (stopped_in_setup).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "ckpt/checkpoint.hpp"
#include "data/dataset.hpp"
#include "dist/process.hpp"
#include "nn/model.hpp"
#include "optim/sgd.hpp"
#include "train/options/options.hpp"
#include "train/state/checkpointing.hpp"
#include "train/state/snapshots.hpp"

namespace hpc::train {

// What set-up hands the step loop.
struct Prepared {
  bool gpu = false;  // this rank trains on its GPU
  bool gpu_decode = false;  // and decodes the packed shards' JPEGs there (--jpeg-decode)
  int threads = 0;   // math-library threads of this rank
  std::string data_dir;
  data::DatasetPair ds;
  std::unique_ptr<nn::Model<float>> model;
  // --sync-batch-norm's own communicator (the model's layers call it).
  std::unique_ptr<dist::Communicator> stats_comm;
  std::unique_ptr<optim::Sgd<float>> sgd;
  std::optional<ckpt::Checkpoint> resume;  // the state to restore, the same bytes on every rank
  bool resumed = false;
  StateSource source = StateSource::None;  // where it came from
  RunPosition start;  // global_batch: this run's, the checkpoint's when resumed
  // --extend-epochs: the checkpoint's --epochs when this run resumed it with more; else 0.
  int64_t extended_from_epochs = 0;
  // --init-from, on a fresh start: where the weights came from and what of them fitted.
  struct InitialWeights {
    std::string path;
    int64_t step = 0;  // the checkpoint's
    FittingState fitted;
  };
  std::optional<InitialWeights> init_from;
};

// A per-rank config file or a different command line on one host is caught before any work,
// naming the first option that differs.
void require_same_options(dist::ProcessContext& ctx, const TrainOptions& o);

Prepared load_data_and_model(dist::ProcessContext& ctx, const TrainOptions& o);

// Whether this rank's GPU decodes the packed shards' JPEGs (--jpeg-decode), given whether it
// trains on its GPU. gpu where it cannot (the CPU trains, the data are not JPEG shards, nvJPEG
// does not load) is a usage error naming why, never a silent CPU decode (DESIGN.md principle 3);
// auto decodes on the CPU then, and says why (when speak) if the data are JPEG shards.
bool resolve_jpeg_decode(const TrainOptions& o, bool gpu, bool speak);

// The optimizer, and the state to start from: initialised by rank 0 (from --seed, then from
// --init-from's checkpoint where it fits) and broadcast, or the checkpoint or host snapshot (in
// run_dir, of run_id: snapshots.hpp) to resume from, checked.
void resume_or_initialise(dist::ProcessContext& ctx, const TrainOptions& o, Prepared& p, const std::string& run_dir,
                          const std::string& run_id);

// Set-up ends each of its parts here (`phase` counts them for the test hook
// HPCTRAIN_TEST_SIGNAL_IN_SETUP=phase[@rank][:NAME]). A stop asked for on any rank ends the run
// before its first step, on every rank alike: the exit code, else nullopt. Nothing new exists
// to save: the checkpoint directory already holds what a later run continues from (the
// checkpoint this one resumed from, or none: a fresh start), so it is the exit of a stop after
// a checkpoint, once the directory is known to be usable (dir_checked; else it is checked here,
// a usage error if not). Unless `save` is given: then the state the run starts from is not in
// the directory (it came from a host's memory), and save() checkpoints it before the exit.
std::optional<int> stopped_in_setup(dist::ProcessContext& ctx, const TrainOptions& o, int phase, const char* during,
                                    bool dir_checked, const std::function<void()>& save = {});

}  // namespace hpc::train

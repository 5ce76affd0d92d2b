// Serving a checkpoint: `hpctrain export` (the model as an ONNX file for other runtimes) and
// `hpctrain predict` (the model on the user's own PNG and JPEG images). Both read a checkpoint
// as `evaluate` does and need no dataset files: what the model must know of its dataset comes
// from data/facts.hpp (packed shards' class names from the checkpoint, or from an older one's
// --data-dir). Each parses its own options
// (argv[0] is the subcommand) and returns the exit code; bad input throws hpc::Error.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "ckpt/checkpoint.hpp"
#include "data/facts.hpp"
#include "dist/process.hpp"
#include "nn/model.hpp"

namespace hpc::train {

// Rank 0 checks the output, exports and prints one line; the other ranks have nothing to do.
int run_export(int argc, const char* const* argv, dist::ProcessContext& ctx);

// The images (files, or directories walked for *.png, *.jpg, *.jpeg) in batches, each global
// batch on one rank in turn; rank 0 prints every image's top classes in the order of the list.
int run_predict(int argc, const char* const* argv, dist::ProcessContext& ctx);

// A checkpoint's model ready for inference, on every rank.
struct ServingModel {
  std::string path;  // the checkpoint file (a directory's newest valid one)
  ckpt::Checkpoint checkpoint;
  data::DatasetFacts facts;
  std::unique_ptr<nn::Model<float>> model;
  // The checkpoint's parameter checksum: the `param_checksum` a run's done line reports for the
  // same parameters (64-bit FNV-1a over the arena).
  std::string param_checksum() const;
};

// Reads and verifies `checkpoint` (a file or a directory's newest valid one) on rank 0 and builds
// its model on every rank. Usage errors: a damaged checkpoint, one of a model this hpctrain does
// not know or whose parameters do not fit it, parameters that are not finite; packed shards whose
// data_dir (when given) has other classes than the checkpoint, or, in a checkpoint that records
// none (one warning), without a data_dir whose classes can be read (data::packed_class_names).
ServingModel load_serving_model(const std::string& checkpoint, const std::string& data_dir, dist::ProcessContext& ctx);

// Why a verified checkpoint cannot be resumed or served: its position invalid, its state not
// finite, an optimizer state of another size than its parameters, or arenas that do not fit the
// model its options describe (another layout, a parameter or statistics count that is not the
// model's), as a resume or load_serving_model would refuse it; nothing where it fits, or where the
// model cannot be known without the dataset (packed shards' checkpoints that record no class
// names). For hpctrain inspect.
std::optional<std::string> model_misfit(const ckpt::Checkpoint& c);

}  // namespace hpc::train

// hpctrain's subcommands besides training: `hpctrain evaluate` (the test accuracy of a
// checkpoint) and `hpctrain inspect` (what a checkpoint file or directory holds). Each parses
// its own options (argv[0] is the subcommand's name) and returns the process exit code; bad
// input throws hpc::Error as training does.
#pragma once

#include "dist/process.hpp"

namespace hpc::train {

// hpctrain's subcommands; `train` also runs when the first argument is an option.
inline constexpr const char* kCommandNames[] = {"train", "evaluate", "inspect", "export", "predict", "clean-snapshots",
                                             "persist-snapshot"};

// A first argument that is not an option must name a subcommand: a usage error naming them
// otherwise ("unknown command 'evalute' (did you mean evaluate?) ..."), not Boost's "too many
// positional options" from the training options it would fall through to.
void require_known_command(const char* word);

// Every rank evaluates its share of the test set's batches; rank 0 prints the result.
int run_evaluate(int argc, const char* const* argv, dist::ProcessContext& ctx);

// Rank 0 alone reads and prints; 0 when the file (or some checkpoint of the directory) is
// valid, kExitUsage when it is not.
int run_inspect(int argc, const char* const* argv, dist::ProcessContext& ctx);

}  // namespace hpc::train

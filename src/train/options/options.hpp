// The parser of a training run's settings (TrainOptions, train_options.hpp) from the command line
// and a config file. The options themselves are one table (option_table.hpp): each entry names an
// option, the member it sets, its help and its rule for ranks and resume; the Boost options,
// --help, the cross-rank agreement check, the resume check and the checkpoint's record of the
// options (and reading it back) are all made from it.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "train/options/option_checks.hpp"
#include "train/options/train_options.hpp"

namespace hpc::train {

struct OptionRule {
  std::string name;  // the long option, without "--"
  Rule rule;
};
// Every option of the table, in --help's order (not --help, --version and --config, which
// belong to the command line, not to a run).
std::vector<OptionRule> option_rules();

// The options that decide what is computed (rule Agree or Match), by long name with their values
// as text: every rank must agree on them, a checkpoint records them ("option.NAME"), and a
// resumed run must match those of rule Match.
std::vector<std::pair<std::string, std::string>> option_values(const TrainOptions& o);
// Every option of the table with its value as text (the metrics file's config event).
std::vector<std::pair<std::string, std::string>> all_option_values(const TrainOptions& o);
// What every rank compares (setup.cpp): option_values, and the Local options whose text must still
// be the same on every rank, as hpcrun, mpirun and the Slurm scripts give it: --checkpoint-dir,
// --resume, --snapshot-every-steps, --checkpoint-every-steps and --checkpoint-each-epoch, which
// every rank's stop, resume and checkpoints follow (rank 0 alone writes the checkpoints, but a
// rank without them would wait in another collective), and --timeline-file, whose Chrome trace
// every rank records (a rank without it waited for ever before the first step), and --stop-signals
// (one signal to the job stops every rank, or none: a rank without it died of it). Not --snapshot-dir:
// where each host keeps its memory copies, read by that host's first rank alone.
std::vector<std::pair<std::string, std::string>> values_every_rank_shares(const TrainOptions& o);
// Whether a resumed run must match the checkpoint's value of this option (rule Match).
bool must_match_on_resume(const std::string& name);
// Whether a checkpoint's meta section records --NAME ("option.NAME", option_values' text; one
// written before an option was added lacks it).
bool records_option(const std::map<std::string, std::string>& meta, const std::string& name);
// The options `names` as a checkpoint's meta section records them, read back through the table
// (each option's inverse of its text), typed; the rest of the result keeps its defaults. One the
// checkpoint does not record, or records as text no run writes, is a usage error naming it.
TrainOptions recorded_options(const std::map<std::string, std::string>& meta,
                              const std::vector<std::string>& names);

// --help's text.
std::string help_text();

// Parses argv (and --config FILE). Returns nullopt when --help or --version was handled.
// Any problem is a usage error (exit code 2) naming it. Only a process with `speak` prints
// --help and --version (rank 0 of a multi-rank job).
std::optional<TrainOptions> parse_options(int argc, const char* const* argv, bool speak = true);

}  // namespace hpc::train

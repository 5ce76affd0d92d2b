// The table of hpctrain's training options (options.hpp says what is made from it). Internal to
// the option parser (options.cpp) and its tests.
#pragma once

#include <boost/program_options.hpp>

#include <functional>
#include <string>
#include <vector>

#include "core/option_kit.hpp"
#include "train/options/train_options.hpp"

namespace hpc::train {

// One option: an entry of the kit every command line uses (core/option_kit.hpp: its name, how it
// meets a TrainOptions, its value as text, which every rank compares and a checkpoint records, and
// the inverse of that text), and its rule for ranks and resume. The factories in option_table.cpp
// (number, path, flag, negation, choice, duration, ...) make them: each takes the member the
// option sets and its Rule, and shows the member's default in --help.
struct Option : options::Entry<TrainOptions> {
  Rule rule;
};

struct OptionGroup {
  const char* caption;  // --help's heading
  std::vector<Option> options;
};

// Every option, in --help's groups and order.
const std::vector<OptionGroup>& option_table();

}  // namespace hpc::train

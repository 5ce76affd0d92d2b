// The table of hpctrain's training options (options.hpp says what is made from it). Internal to
// the option parser (options.cpp) and its tests.
#pragma once

#include <boost/program_options.hpp>

#include <functional>
#include <string>
#include <vector>

#include "train/train_options.hpp"

namespace hpc::train {

// One option: its name, rule and help, and how it meets a TrainOptions. The factories in
// option_table.cpp (number, path, flag, negation, choice, duration, ...) make them: each takes
// the member the option sets and its Rule, and shows the member's default in --help.
struct Option {
  std::string name;  // the long option, without "--"
  Rule rule;
  // Adds it to a Boost description, bound to o's member where Boost can fill it itself.
  std::function<void(boost::program_options::options_description& d, TrainOptions& o)> add;
  // After parsing: the members Boost cannot fill (choices, --no-X switches, durations, lists),
  // from what it stored in vm. May be empty.
  std::function<void(const boost::program_options::variables_map& vm, TrainOptions& o)> read;
  // The value as text: option_values, hence what every rank compares and a checkpoint records
  // (so an option's text must never change).
  std::function<std::string(const TrainOptions& o)> value;
  // The inverse of value: the member from its text, as a checkpoint records it ("option.NAME").
  // Text that value cannot have written is the checkpoint's usage error, naming the option.
  std::function<void(const std::string& text, TrainOptions& o)> parse;
};

struct OptionGroup {
  const char* caption;  // --help's heading
  std::vector<Option> options;
};

// Every option, in --help's groups and order.
const std::vector<OptionGroup>& option_table();

}  // namespace hpc::train

// How hpctrain's subcommands other than training (evaluate, inspect, export, predict) read their
// command lines: each has a usage text, --help and an option table (core/option_kit.hpp) over
// its own options struct, read on every rank alike, then checked by the subcommand's own rules.
// One piece of code, so that --help, the parse, the table's reads and the checks happen in the
// same order for each, and one rank's bad option is every rank's error.
#pragma once

#include <boost/program_options.hpp>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/option_kit.hpp"
#include "dist/agree.hpp"
#include "dist/process.hpp"

namespace hpc::train {

// A subcommand's options struct S, read from argv (argv[0]: the subcommand's name) on every
// rank: `usage` heads --help, then --help itself and the table's options; words beyond the
// options go to `positional`. After the table's own reads, `check` (may be empty) applies the
// subcommand's rules to what was read. Returns nullopt when --help was handled (rank 0 prints
// it); anything wrong is a usage error on every rank (dist::collectively).
template <class S>
std::optional<S> parse_subcommand_options(int argc, const char* const* argv, dist::ProcessContext& ctx,
                                          const std::string& usage, const std::vector<options::Entry<S>>& table,
                                          const boost::program_options::positional_options_description& positional,
                                          const std::function<void(S& s, const boost::program_options::variables_map& vm)>& check) {
  namespace po = boost::program_options;
  S s;  // the table's Boost options write into it: it stays here until they are done
  po::options_description options(usage);
  options.add_options()("help,h", "print this help and exit");
  options::add(table, options, s);
  po::variables_map vm;
  bool go = false;
  dist::collectively(ctx, [&] {
    go = options::parse_subcommand(argc, argv, options, positional, vm, ctx.rank() == 0);
    if (!go) return;
    options::read(table, vm, s);
    if (check) check(s, vm);
  });
  if (!go) return std::nullopt;
  return s;
}

// The options evaluate, export and predict share, with the same words in each one's --help.
namespace subcommand_options {

// --checkpoint: required.
template <class S>
options::Entry<S> checkpoint(std::string S::*m, const char* newest = "its newest valid one") {
  return options::path("checkpoint", m, std::string("a checkpoint file, or a directory (") + newest + ")",
                       options::Presence::Required);
}

// --data-dir of a served model: packed shards' classes, for a checkpoint that records none.
template <class S>
options::Entry<S> served_data_dir(std::string S::*m) {
  return options::path("data-dir", m,
                       "packed shards: a packed dataset, whose classes (its manifests', as training reads them) must "
                       "be the checkpoint's (needed only for a checkpoint written before 2026-11-26, which records no "
                       "class names; refused for a model of another dataset)",
                       options::Presence::NotBlank);
}

// --threads: `what` ("math-library threads") per rank, as training counts them.
template <class S>
options::Entry<S> threads(int S::*m, const char* what) {
  return options::number("threads", m,
                         std::string(what) + " per rank (0: OMP_NUM_THREADS where set, else this rank's share of the "
                         "CPUs it may use: its affinity and cgroup quota)");
}

}  // namespace subcommand_options
}  // namespace hpc::train

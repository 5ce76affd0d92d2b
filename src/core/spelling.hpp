// Suggestions for a misspelt name ("evalute": did you mean evaluate?), for the usage errors that
// refuse one: a subcommand, an MCA parameter in hpcrun's --mpi-args.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace hpc {

// The known name nearest to `word` by edit distance (insertions, deletions, substitutions and
// swaps of neighbours), when it is near enough to be a typo of it (at most a third of the word's
// letters, and at least one); "" when none is.
std::string nearest_name(const std::vector<std::string>& known, std::string_view word);

// " (did you mean NAME?)" for nearest_name's answer, "" when it has none.
std::string did_you_mean(const std::vector<std::string>& known, std::string_view word);

}  // namespace hpc

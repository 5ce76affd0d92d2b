#include "core/spelling.hpp"

#include <algorithm>

namespace hpc {

namespace {

// Optimal string alignment distance: Levenshtein plus the swap of two neighbours ("inpsect").
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

}  // namespace

std::string nearest_name(const std::vector<std::string>& known, std::string_view word) {
  const size_t limit = std::max<size_t>(1, word.size() / 3);
  std::string best;
  size_t best_distance = limit + 1;
  for (const std::string& k : known) {
    const size_t d = edit_distance(word, k);
    if (d < best_distance) best = k, best_distance = d;
  }
  return best;
}

std::string did_you_mean(const std::vector<std::string>& known, std::string_view word) {
  const std::string n = nearest_name(known, word);
  return n.empty() ? "" : " (did you mean " + n + "?)";
}

}  // namespace hpc

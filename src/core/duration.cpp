#include "core/duration.hpp"

#include <charconv>
#include <cmath>
#include <iomanip>
#include <sstream>
#include <utility>

#include "core/error.hpp"

namespace hpc {

double parse_duration(const std::string& text, const char* option) {
  // from_chars, not stod: stod took "0x10" for 16 s, and leading spaces and a '+' (numbers are
  // refused so everywhere else).
  double v = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v, std::chars_format::general);
  const size_t used = ec == std::errc() ? static_cast<size_t>(end - text.data()) : 0;
  const std::string unit = text.substr(used);
  const double scale = unit.empty() || unit == "s" ? 1 : unit == "m" ? 60 : unit == "h" ? 3600 : -1;
  HPC_REQUIRE(used > 0 && scale > 0 && std::isfinite(v) && v >= 0, "--", option,
              " must be a duration such as 90s, 10m or 1.5h, got '", text, "'");
  return v * scale;
}

std::string show_duration(double seconds) {
  const auto [value, unit] = seconds < 120    ? std::pair{seconds, " s"}
                             : seconds < 7200 ? std::pair{seconds / 60, " min"}
                                              : std::pair{seconds / 3600, " h"};
  std::ostringstream os;
  // Three significant digits, but whole numbers past 999: 1001 h, not 1e+03 h.
  if (std::abs(value) < 999.5) os << std::setprecision(3) << value;
  else os << std::fixed << std::setprecision(0) << value;
  os << unit;
  return os.str();
}

}  // namespace hpc

#include "core/duration.hpp"

#include <cmath>
#include <sstream>

#include "core/error.hpp"

namespace hpc {

double parse_duration(const std::string& text, const char* option) {
  size_t used = 0;
  double v = -1;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string unit = text.substr(used);
  const double scale = unit.empty() || unit == "s" ? 1 : unit == "m" ? 60 : unit == "h" ? 3600 : -1;
  HPC_REQUIRE(used > 0 && scale > 0 && std::isfinite(v) && v >= 0, "--", option,
              " must be a duration such as 90s, 10m or 1.5h (0: off), got '", text, "'");
  return v * scale;
}

std::string show_duration(double seconds) {
  std::ostringstream os;
  os.precision(3);
  if (seconds < 120) os << seconds << " s";
  else if (seconds < 7200) os << seconds / 60 << " min";
  else os << seconds / 3600 << " h";
  return os.str();
}

}  // namespace hpc

// Durations as people write them on command lines: "90", "90s", "10m", "1.5h". Shared by
// hpctrain's options and hpcrun's.
#pragma once

#include <string>

namespace hpc {

// Seconds; a usage error naming --option when `text` is not a non-negative duration.
double parse_duration(const std::string& text, const char* option);

// For messages, three digits: "0.5 s", "90 s", "10 min", "1.5 h".
std::string show_duration(double seconds);

}  // namespace hpc

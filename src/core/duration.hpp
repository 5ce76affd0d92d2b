// Durations as people write them on command lines: "90", "90s", "10m", "1.5h". Shared by
// hpctrain's options and hpcrun's.
#pragma once

#include <string>

namespace hpc {

// Seconds; a usage error naming --option when `text` is not a non-negative duration.
double parse_duration(const std::string& text, const char* option);

// For messages, three digits: "0.5 s", "90 s", "10 min", "1.5 h".
std::string show_duration(double seconds);

// The longest wait an option of hpctrain or hpcrun gives (their timeouts, --checkpoint-lock-wait,
// hpcrun's --elastic-timeout, ...): 1000 h. Longer is no wait anyone means (1e300h is infinite),
// and the watchdogs count in int64 nanoseconds.
constexpr double kLongestWait = 1000 * 3600.0;

}  // namespace hpc

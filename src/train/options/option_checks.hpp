// Checks of option values shared by hpctrain's training options (options.cpp, option_table.cpp)
// and its other subcommands (evaluate, predict, export): each a usage error naming the option and
// the value.
#pragma once

#include <cstdint>
#include <string>

namespace hpc::train {

void require_positive(int64_t v, const char* option);
void require_non_negative(int64_t v, const char* option);
void require_thread_count(int threads);  // --threads: 0 (all cores) to 4096
void require_batch_size(int64_t v, const char* option);  // 1 to a billion
// The watchdogs count in int64 nanoseconds: beyond 1000 h a timeout means "never" anyway, and
// under a second it would end healthy runs whose steps take that long.
constexpr double kMaxWatchdogTimeout = 1000 * 3600.0;
void require_watchdog_timeout(double seconds, const char* option);  // 0 (never), or 1 s to 1000 h

}  // namespace hpc::train

// Checks of option values shared by hpctrain's training options (options.cpp, option_table.cpp)
// and its other subcommands (evaluate, predict, export): each a usage error naming the option and
// the value.
#pragma once

#include <cstdint>
#include <string>

namespace hpc::train {

void require_positive(int64_t v, const char* option);
void require_non_negative(int64_t v, const char* option);
void require_thread_count(int threads);  // --threads: 0 (OMP_NUM_THREADS, else the rank's CPUs) to 4096
void require_batch_size(int64_t v, const char* option);  // 1 to a billion
// 0 (never), or 1 s to 1000 h (kLongestWait): under a second a watchdog would end healthy runs
// whose steps take that long.
void require_watchdog_timeout(double seconds, const char* option);

}  // namespace hpc::train

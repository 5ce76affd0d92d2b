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

}  // namespace hpc::train

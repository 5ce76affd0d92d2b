#include "train/options/option_checks.hpp"

#include "core/duration.hpp"
#include "core/error.hpp"

namespace hpc::train {

// Sample indices are 32-bit inside (ShardedSampler), and no dataset hpctrain reads holds more
// than 2^32 samples: a billion is far above any real batch and keeps the products hpctrain
// forms (batch x ranks, epochs x steps per epoch) far from overflowing.
constexpr int64_t kMaxBatch = 1'000'000'000;

void require_positive(int64_t v, const char* option) {
  HPC_REQUIRE(v > 0, "--", option, " must be a positive integer, got ", v);
}

void require_non_negative(int64_t v, const char* option) {
  HPC_REQUIRE(v >= 0, "--", option, " must not be negative, got ", v);
}

void require_batch_size(int64_t v, const char* option) {
  require_positive(v, option);
  HPC_REQUIRE(v <= kMaxBatch, "--", option, " must be at most ", kMaxBatch, " samples, got ", v);
}

void require_thread_count(int threads) {
  HPC_REQUIRE(threads >= 0 && threads <= 4096,
              "--threads must be between 0 (OMP_NUM_THREADS where set, else this rank's share of the CPUs) and 4096, "
              "got ", threads);
}

void require_watchdog_timeout(double seconds, const char* option) {
  HPC_REQUIRE(seconds == 0 || (seconds >= 1 && seconds <= kLongestWait), "--", option,
              " must be 0 (never) or from 1s to 1000h, got ", show_duration(seconds));
}

}  // namespace hpc::train

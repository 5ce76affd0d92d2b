// Checkpoint files (ckpt/checkpoint.hpp) as `hpctrain inspect`, a resume and `hpctrain predict`
// read them: decoded, then each reader of the meta section and the arenas. Each section's CRC is
// set right first where the section header can be read, so that the search reaches what follows
// the checksums (CheckpointFormat.EveryFlippedBitIsDetected covers the checksums themselves).
#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "ckpt/checkpoint.hpp"
#include "contract.hpp"
#include "train/engine/training_state.hpp"
#include "train/serve/serving.hpp"
#include "train/state/checkpointing.hpp"

namespace {

// magic (8) | u32 version | (u32 kind | u64 n | u32 crc | n bytes)... as decode walks them.
void fix_checksums(std::vector<char>& b) {
  size_t at = 12;
  while (at + 16 <= b.size()) {
    uint32_t kind = 0;
    uint64_t n = 0;
    std::memcpy(&kind, b.data() + at, 4);
    std::memcpy(&n, b.data() + at + 4, 8);
    if (kind == 0xE0F || n > b.size() - at - 16) return;  // the end marker, or a length past the end
    const auto sum = static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(b.data() + at + 16),
                                                 static_cast<uInt>(n)));
    std::memcpy(b.data() + at + 12, &sum, 4);
    at += 16 + n;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hpc;
  std::vector<char> bytes(reinterpret_cast<const char*>(data), reinterpret_cast<const char*>(data) + size);
  fix_checksums(bytes);
  ckpt::Checkpoint c;
  ckpt::Layout layout;
  if (!fuzz::usage_error_or_success([&] { c = ckpt::decode(bytes, "fuzz.hpck", &layout); })) return 0;
  for (const auto& entry : c.meta) {  // (Clang 14's lambdas cannot capture a structured binding)
    const std::string& key = entry.first;
    fuzz::usage_error_or_success([&] { (void)c.integer(key); });
    fuzz::usage_error_or_success([&] { (void)c.number(key); });
  }
  fuzz::usage_error_or_success([&] { ckpt::require_finite_state(c, "fuzz.hpck"); });
  fuzz::usage_error_or_success([&] { (void)train::class_names_of(c); });
  fuzz::usage_error_or_success([&] { (void)train::loss_scaler_of(c); });
  fuzz::usage_error_or_success([&] { (void)train::recorded_position(c); });
  fuzz::usage_error_or_success([&] { train::check_optimizer_state(c); });
  fuzz::usage_error_or_success([&] { (void)train::first_non_finite(c); });
  fuzz::usage_error_or_success([&] { (void)train::model_misfit(c); });
  fuzz::usage_error_or_success([&] { (void)train::state_checksum(c); });
  return 0;
}

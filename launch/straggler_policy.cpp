#include "straggler_policy.hpp"

#include <algorithm>

namespace hpc::launch {

StragglerDecision judge_straggler(const StragglerState& state, const StragglerSighting& seen, double now,
                                  const StragglerPolicy& policy, bool rest_has_min_np) {
  if (seen.host.empty() || !(seen.ratio > policy.factor)) return {};
  if (seen.host != state.host) return {{seen.host, now, 0, false}};
  StragglerDecision d{state, StragglerAction::None, 0};
  d.next.held += std::clamp(now - state.last, 0.0, kLongestSighting);
  d.next.last = now;
  d.held_seconds = d.next.held;
  if (state.named || d.held_seconds < policy.seconds) return d;
  d.next.named = true;
  d.action = !policy.drain ? StragglerAction::Name
             : rest_has_min_np ? StragglerAction::NameAndDrain
                               : StragglerAction::NameNotDrained;
  return d;
}

}  // namespace hpc::launch

// A persistent straggler: the trainer's heartbeat names the rank whose own work per step (busy
// time) is longest over its last seconds, and by how much it exceeds the median rank's
// (train/observe/stragglers.hpp). hpcrun names the host of that rank once when the ratio stays above
// --straggler-factor for --straggler-time, and with --drain-stragglers drains it at the next step
// boundary as it drains a host that left the discovery output, keeping it out for a cooldown (the
// blacklist). A pure decision table, fed one heartbeat at a time.
#pragma once

#include <string>

namespace hpc::launch {

struct StragglerPolicy {
  double factor = 1.5;   // --straggler-factor: busy time over the median's above which a host is slow
  double seconds = 120;  // --straggler-time: how long it must stay so
  bool drain = false;    // --drain-stragglers
};

// What one heartbeat said: the slowest rank's host (hpcrun's name for it; "" when it named none)
// and its ratio.
struct StragglerSighting {
  std::string host;
  double ratio = 1;
};

// The longest time one heartbeat's verdict speaks for: the trainer's window, its last 10 s of
// steps (train/observe/stragglers.cpp). A longer gap between two heartbeats (an evaluation, a
// checkpoint, a step longer than that) adds no more than this to a host's slow time: the verdict
// after an evaluation of minutes is no proof that the host was slow all along.
inline constexpr double kLongestSighting = 10;

// The watch over one attempt: the host slow above the factor in every heartbeat since it was
// first seen so, when the last of them came, how long it has been slow (the gaps between those
// heartbeats, each counted up to kLongestSighting), and whether it was named.
struct StragglerState {
  std::string host;
  double last = 0;
  double held = 0;
  bool named = false;
};

enum class StragglerAction {
  None,
  Name,             // say that the host is a straggler
  NameAndDrain,     // ... and drain it
  NameNotDrained,   // ... which --drain-stragglers would drain, but the rest has too few slots for --min-np
};

struct StragglerDecision {
  StragglerState next;
  StragglerAction action = StragglerAction::None;
  double held_seconds = 0;  // how long the host has been slow (for the message)
};

//  slow above factor? | same host as before? | slow for --straggler-time? | named? | action, then
//  no                 |                      |                            |        | none, forget it
//  yes                | no                   |                            |        | none, watch this host from now
//  (slow for: the gaps between its heartbeats since, each up to kLongestSighting)
//  yes                | yes                  | no                         |        | none
//  yes                | yes                  | yes                        | yes    | none (named once)
//  yes                | yes                  | yes                        | no     | name (drain: when the rest
//                                                                                     has --min-np slots), named
// rest_has_min_np: the known hosts but this one and the blacklisted have --min-np slots.
StragglerDecision judge_straggler(const StragglerState& state, const StragglerSighting& seen, double now,
                                  const StragglerPolicy& policy, bool rest_has_min_np);

}  // namespace hpc::launch

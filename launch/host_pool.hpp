// The hosts hpcrun may use: the static list or the discovery script's latest answer, less those
// blacklisted after a failure (until their cooldown ends) and those that fail a health probe (the
// launch agent, or srun inside Slurm, running `true` there). Placement fills hosts in the order
// given, so rank 0 stays on the first healthy one.
#pragma once

#include <string>
#include <vector>

#include "blacklist.hpp"
#include "job_context.hpp"
#include "options.hpp"

namespace hpc::launch {

// --launch-agent's words, with ssh's options for a batch job: never a password or host-key prompt
// (nobody would answer it), and no connection attempt longer than a probe may take.
std::vector<std::string> agent_command(const LaunchOptions& o);

// `np` slots of `usable`, ranks in its order: the first ones, but where `usable` has more slots
// than `np` (--max-np), the hosts of `keep` (the attempt before: they hold its snapshots in
// memory, the only copy of its last steps after a stop to grow or drain) are placed first, and
// the others fill the rest. Else a joining host, or a discovery script's new order, put the job
// wholly on other hosts, and the relaunch resumed an older checkpoint.
HostList place(const HostList& usable, int np, const HostList& keep = {});

class HostPool {
 public:
  HostPool(const LaunchOptions& o, const Clock& clock, Voice& voice, SignalInbox& signals);

  // Runs the discovery script; false when it failed (the previous answer stays). The first run's
  // failure is a usage error.
  bool discover(bool first);
  HostList known_hosts();  // the static list, or the discovery script's latest answer
  HostList healthy(const HostList& candidates);  // the ones not blacklisted that answer a probe
  std::vector<std::string> probe_command(const std::string& host) const;
  // The ranks to start on `usable`: its slots, at most --max-np (and -np on the first launch).
  int target_np(const HostList& usable, bool first) const;
  // Blocks until healthy hosts have --min-np slots; false after --elastic-timeout (or a signal).
  // Where hosts in their cooldown would make up the slots, it waits for them past it: until they
  // are back and probed (their cooldown is hpcrun's own, not hosts that may never come).
  bool wait_for_hosts(HostList* usable, bool first);
  // Why the last wait_for_hosts gave up ("gave up: ... after waiting --elastic-timeout ..."), "" for a signal.
  const std::string& gave_up() const { return gave_up_; }
  // When hosts now in their cooldown are back with `known`'s others to make up --min-np slots
  // (`now` when they need none; a negative time when even all of them have too few).
  double back_with_enough_slots(const HostList& known, double now) const;
  // Whether the known hosts, but `host` and the blacklisted, have --min-np slots.
  bool enough_slots_without(const std::string& host);
  // The known hosts outside the placement that answer a probe, by name ("" when none).
  std::string joining_hosts(const HostList& placement, const HostList& known);
  // The host failed at `t`: kept out for the cooldown returned.
  double blacklist(const std::string& host, double t) { return blacklist_.fail(host, t); }
  // The host ran the job from `from` to `to` without failing: MAX of that, over attempts since its
  // last failure, and its next failure's cooldown is MIN again.
  void served(const std::string& host, double from, double to) { blacklist_.served(host, from, to); }
  int failures(const std::string& host) const { return blacklist_.failures(host); }

 private:
  const LaunchOptions& o_;
  const Clock& clock_;
  Voice& voice_;
  SignalInbox& signals_;
  Blacklist blacklist_;
  HostList discovered_;
  double last_discovery_ = -1e9;
  std::string gave_up_;
};

}  // namespace hpc::launch

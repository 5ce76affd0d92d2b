// Hosts that failed, kept out of the job for a cooldown that doubles with each failure of the
// same host (--blacklist-cooldown MIN:MAX), so a flapping host is tried again, less and less
// often, and a healthy one that failed once is soon back. A host that then runs the job for MAX
// without failing is no longer flapping at the scale the user gave: its count starts over, and
// its next failure costs MIN again (else a host that failed a few times in a job's first hours
// was kept out for MAX at every failure after, however long it had served in between). Times are
// seconds on a monotonic clock.
#pragma once

#include <map>
#include <string>

namespace hpc::launch {

class Blacklist {
 public:
  Blacklist(double min_seconds, double max_seconds) : min_(min_seconds), max_(max_seconds) {}

  // The host failed at `now`: returns the cooldown it gets (MIN, 2 MIN, 4 MIN, ... up to MAX).
  double fail(const std::string& host, double now);
  // The host ran in an attempt of the job from `from` to `to`. The time since its last failure
  // adds up over attempts; once it reaches MAX, its failure count starts over.
  void served(const std::string& host, double from, double to);
  bool blocked(const std::string& host, double now) const;
  // Seconds until the host may be tried again (0 when it may be now).
  double remaining(const std::string& host, double now) const;
  int failures(const std::string& host) const;
  // The soonest moment a blocked host comes free, or `now` when none is blocked.
  double next_release(double now) const;

 private:
  struct Entry {
    int failures = 0;
    double until = 0;
    double failed_at = 0;
    double served = 0;  // seconds in the job since `failed_at`
  };
  double min_, max_;
  std::map<std::string, Entry> hosts_;
};

// "--blacklist-cooldown 60:600" (durations, so "1m:10m" too): MIN and MAX seconds.
void parse_cooldown(const std::string& text, double* min_seconds, double* max_seconds);

}  // namespace hpc::launch

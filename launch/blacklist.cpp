#include "blacklist.hpp"

#include <algorithm>
#include <cmath>

#include "core/duration.hpp"
#include "core/error.hpp"

namespace hpc::launch {

double Blacklist::fail(const std::string& host, double now) {
  Entry& e = hosts_[host];
  ++e.failures;
  e.failed_at = now;
  e.served = 0;
  const double cooldown = std::min(max_, min_ * std::pow(2.0, std::min(e.failures - 1, 60)));
  e.until = now + cooldown;
  return cooldown;
}

void Blacklist::served(const std::string& host, double from, double to) {
  const auto it = hosts_.find(host);
  if (it == hosts_.end()) return;  // never failed: nothing to forgive
  Entry& e = it->second;
  // Only the part after its last failure (a straggler drained mid-attempt ran on until the stop).
  e.served += std::max(0.0, to - std::max(from, e.failed_at));
  if (e.served >= max_) e.failures = 0;
}

bool Blacklist::blocked(const std::string& host, double now) const { return remaining(host, now) > 0; }

double Blacklist::remaining(const std::string& host, double now) const {
  const auto it = hosts_.find(host);
  return it == hosts_.end() ? 0 : std::max(0.0, it->second.until - now);
}

int Blacklist::failures(const std::string& host) const {
  const auto it = hosts_.find(host);
  return it == hosts_.end() ? 0 : it->second.failures;
}

double Blacklist::next_release(double now) const {
  double soonest = -1;
  for (const auto& [host, e] : hosts_)
    if (e.until > now && (soonest < 0 || e.until < soonest)) soonest = e.until;
  return soonest < 0 ? now : soonest;
}

void parse_cooldown(const std::string& text, double* min_seconds, double* max_seconds) {
  const size_t colon = text.find(':');
  HPC_REQUIRE(colon != std::string::npos, "--blacklist-cooldown must be MIN:MAX (e.g. 60:600 or 1m:10m), got '", text, "'");
  *min_seconds = parse_duration(text.substr(0, colon), "blacklist-cooldown");
  *max_seconds = parse_duration(text.substr(colon + 1), "blacklist-cooldown");
  HPC_REQUIRE(*min_seconds > 0 && *max_seconds >= *min_seconds,
              "--blacklist-cooldown needs 0 < MIN <= MAX, got '", text, "'");
}

}  // namespace hpc::launch

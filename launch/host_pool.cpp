#include "host_pool.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "core/duration.hpp"
#include "core/error.hpp"
#include "core/file_identity.hpp"
#include "subprocess.hpp"

namespace hpc::launch {
namespace fs = std::filesystem;

HostPool::HostPool(const LaunchOptions& o, const Clock& clock, Voice& voice, SignalInbox& signals)
    : o_(o), clock_(clock), voice_(voice), signals_(signals), blacklist_(o.cooldown_min, o.cooldown_max) {}

bool HostPool::discover(bool first) {
  last_discovery_ = clock_.now();
  // Again before every run: a script another user made writable, or swapped, since the start
  // would run their code as this user.
  try {
    std::string why;
    const std::string script = find_program(o_.discovery_script, &why);
    if (!script.empty()) require_safe_file(script, "--host-discovery-script");
  } catch (const Error& e) {
    if (first) throw;
    voice_.say(std::string("warning: ") + e.what() + "; not running it, keeping its previous answer");
    return false;
  }
  const CommandResult r = run_command({o_.discovery_script}, o_.probe_timeout, /*merge_stderr=*/false);
  // The interval counts from the end of a run: a script slower than --discovery-interval was run
  // again at once, back to back, and hpcrun's loop spent its time in it (no output read, no signal
  // taken, mpirun's end not seen), as Horovod's driver sleeps the interval after each discovery.
  last_discovery_ = clock_.now();
  // Past the bytes kept, hosts would be lost without a word, and the last line kept cut in two
  // (node12 for node1234).
  if (r.ok() && r.output_cut) {
    const std::string msg = "host discovery script " + o_.discovery_script + " printed more than " +
                            std::to_string(kMaxCommandOutput >> 20) + " MiB, more than a host list";
    if (first) usage_error(msg);
    voice_.say("warning: " + msg + "; keeping its previous answer");
    return false;
  }
  if (!r.ok()) {
    const std::string msg = "host discovery script " + o_.discovery_script + " failed: " + r.why();
    if (first) usage_error(msg);
    voice_.say("warning: " + msg + "; keeping its previous answer");
    return false;
  }
  try {
    discovered_ = parse_discovery_output(r.output, o_.slots_per_host, "host discovery script " + o_.discovery_script);
  } catch (const Error& e) {
    if (first) throw;
    voice_.say(std::string("warning: ") + e.what() + "; keeping its previous answer");
    return false;
  }
  return true;
}

HostList HostPool::known_hosts() {
  if (o_.host_source != HostSource::Discovery) return o_.static_hosts;
  if (clock_.now() - last_discovery_ >= o_.discovery_interval) discover(false);
  return discovered_;
}

// For ssh: never a password or host-key prompt (nobody would answer it, and the probe or mpirun's
// start-up would wait for it), and no connection attempt longer than a probe may take: a host that
// does not answer would otherwise hold a probe, or mpirun's start-up, for ssh's default, the
// system's TCP connect timeout (two minutes). On the command line these outrank the user's config.
std::vector<std::string> agent_command(const LaunchOptions& o) {
  std::vector<std::string> cmd;
  std::stringstream words(o.launch_agent);
  for (std::string w; words >> w;) cmd.push_back(w);
  if (fs::path(cmd[0]).filename() == "ssh") {
    const int connect = std::max(1, static_cast<int>(o.probe_timeout));
    cmd.insert(cmd.begin() + 1, {"-o", "BatchMode=yes", "-o", "ConnectTimeout=" + std::to_string(connect)});
  }
  return cmd;
}

std::vector<std::string> HostPool::probe_command(const std::string& host) const {
  if (o_.host_source == HostSource::Slurm && !o_.launch_agent_given)
    return {"srun", "--overlap", "--nodes=1", "--ntasks=1", "--nodelist=" + host, "true"};
  std::vector<std::string> cmd = agent_command(o_);
  cmd.push_back(host);
  cmd.push_back("true");
  return cmd;
}

HostList HostPool::healthy(const HostList& candidates) {
  HostList out, to_probe;
  const double t = clock_.now();
  for (const Host& h : candidates) {
    if (blacklist_.blocked(h.name, t)) continue;
    if (is_local_host(h.name)) out.push_back(h);
    else to_probe.push_back(h);
  }
  if (to_probe.empty()) return out;
  std::vector<std::vector<std::string>> commands;
  for (const Host& h : to_probe) commands.push_back(probe_command(h.name));
  const std::vector<CommandResult> results = run_commands(commands, o_.probe_timeout);
  for (size_t i = 0; i < to_probe.size(); ++i) {
    if (results[i].ok()) {
      out.push_back(to_probe[i]);
    } else {
      const double cooldown = blacklist_.fail(to_probe[i].name, clock_.now());
      voice_.say("host " + to_probe[i].name + " failed its health probe (" + results[i].why() + "); blacklisted for " +
          show_duration(cooldown));
    }
  }
  // Keep the order the hosts were given in: rank 0 stays on the first healthy one.
  HostList ordered;
  for (const Host& h : candidates)
    if (has_host(out, h.name)) ordered.push_back(h);
  return ordered;
}

int HostPool::target_np(const HostList& usable, bool first) const {
  int np = total_slots(usable);
  if (o_.max_np) np = std::min(np, o_.max_np);
  if (first && o_.np) np = std::min(np, o_.np);
  return np;
}

HostList place(const HostList& usable, int np, const HostList& keep) {
  // Which slots: the hosts of `keep` first, then the others, each in the order given.
  std::vector<int> take(usable.size(), 0);
  for (const bool kept : {true, false})
    for (size_t i = 0; i < usable.size() && np > 0; ++i)
      if (has_host(keep, usable[i].name) == kept) {
        take[i] = std::min(usable[i].slots, np);
        np -= take[i];
      }
  // Ranks in the order given: rank 0 on the first host placed.
  HostList placement;
  for (size_t i = 0; i < usable.size(); ++i)
    if (take[i] > 0) placement.push_back({usable[i].name, take[i]});
  return placement;
}

double HostPool::back_with_enough_slots(const HostList& known, double now) const {
  int slots = 0;
  std::vector<std::pair<double, int>> cooling;  // (back at, slots)
  for (const Host& h : known) {
    if (blacklist_.blocked(h.name, now)) cooling.emplace_back(now + blacklist_.remaining(h.name, now), h.slots);
    else slots += h.slots;
  }
  if (slots >= o_.min_np) return now;
  std::sort(cooling.begin(), cooling.end());
  for (const auto& [at, more] : cooling)
    if ((slots += more) >= o_.min_np) return at;
  return -1;
}

bool HostPool::wait_for_hosts(HostList* usable, bool first) {
  gave_up_.clear();
  const double start = clock_.now();
  double deadline = start + o_.elastic_timeout;
  // A job on one host that failed (or on hosts that all did) waited out --elastic-timeout alone,
  // shorter than the cooldown, and ended with restarts left: it waits for them, and their probe.
  const double back = back_with_enough_slots(known_hosts(), start);
  if (back > deadline) deadline = back + o_.probe_timeout + 1;
  bool announced = false;
  for (;;) {
    *usable = healthy(known_hosts());
    // A signal that came during the probes (which run to their end, --probe-timeout at most):
    // nothing is launched. It had waited for the next attempt's start-up, and stopped that.
    if (int sig; signals_.take(&sig)) {
      voice_.say(std::string("stopping on ") + ::strsignal(sig) + " while probing hosts");
      return false;
    }
    const int slots = total_slots(*usable);
    if (slots >= o_.min_np) return true;
    const std::string have = std::to_string(slots) + " healthy slot(s)" +
                             (usable->empty() ? "" : " (" + show_hosts(*usable) + ")") + ", --min-np " +
                             std::to_string(o_.min_np) + " needed";
    // A fixed host list that cannot start the job at all is bad input, not a reason to wait. Slurm's
    // allocation is not bad input: a node of it that does not answer is a node failure, exit 1, which
    // slurm/job.sh requeues (onto other nodes); exit 2 it never requeues.
    if (first && o_.host_source == HostSource::Slurm) {
      gave_up_ = "gave up: cannot start: " + have + " in Slurm's allocation (a node that does not answer failed)";
      return false;
    }
    if (first && o_.host_source != HostSource::Discovery) usage_error("cannot start: ", have);
    if (clock_.now() >= deadline) {
      // The job's last line, after its summary (the caller's to say): exit 1's reason, last.
      gave_up_ = "gave up: " + have + " after waiting --elastic-timeout " + show_duration(o_.elastic_timeout);
      return false;
    }
    if (!announced) {
      const bool cooldown = deadline > start + o_.elastic_timeout;
      voice_.say("waiting up to " + show_duration(cooldown ? std::ceil(deadline - start) : o_.elastic_timeout) +
                 " for hosts: " + have +
                 (cooldown ? " (past --elastic-timeout " + show_duration(o_.elastic_timeout) +
                                 ": hosts in their --blacklist-cooldown make them up when they are back)"
                           : ""));
      announced = true;
    }
    // Until a blacklisted host comes free, the next discovery, or a second, whichever is first.
    const double t = clock_.now();
    double until = std::min(t + 1.0, deadline);
    if (blacklist_.next_release(t) > t) until = std::min(until, blacklist_.next_release(t));
    while (clock_.now() < until) {
      int sig;
      if (signals_.take(&sig)) {
        voice_.say(std::string("stopping on ") + ::strsignal(sig) + " while waiting for hosts");
        return false;
      }
      ::usleep(50000);
    }
  }
}

bool HostPool::enough_slots_without(const std::string& host) {
  int slots = 0;
  for (const Host& h : known_hosts())
    if (h.name != host && !blacklist_.blocked(h.name, clock_.now())) slots += h.slots;
  return slots >= o_.min_np;
}

// The known hosts outside the placement that answer a probe, by name ("" when none).
std::string HostPool::joining_hosts(const HostList& placement, const HostList& known) {
  HostList candidates;
  for (const Host& h : known)
    if (!has_host(placement, h.name) && !blacklist_.blocked(h.name, clock_.now())) candidates.push_back(h);
  if (candidates.empty()) return "";
  std::string names;
  for (const Host& h : healthy(candidates)) {
    names += (names.empty() ? "" : ", ") + h.name;
    if (blacklist_.failures(h.name) > 0) voice_.say("host " + h.name + " is back after its cooldown");
  }
  return names;
}

}  // namespace hpc::launch

#include "analysis.hpp"

#include <algorithm>
#include <cctype>
#include <csignal>
#include <cstdlib>
#include <map>
#include <optional>
#include <sstream>

#include "core/exit_codes.hpp"
#include "hosts.hpp"

namespace hpc::launch {

std::vector<std::string> rank_hosts(const HostList& placement) {
  std::vector<std::string> hosts;
  for (const Host& h : placement) hosts.insert(hosts.end(), static_cast<size_t>(h.slots), h.name);
  return hosts;
}

namespace {
// The first word after `key` in `line`, or "" where `key` is not in it.
std::string word_after(const std::string& line, const std::string& key) {
  const size_t at = line.find(key);
  if (at == std::string::npos) return "";
  std::istringstream rest(line.substr(at + key.size()));
  std::string word;
  rest >> word;
  return word;
}
}  // namespace

bool ProcessMap::take(const std::string& line) {
  const size_t start = line.find_first_not_of(" \t");
  const std::string l = start == std::string::npos ? "" : line.substr(start);
  if (!inside_) {
    if (l.rfind("Data for JOB", 0) != 0 && l.find(" JOB MAP ") == std::string::npos) return false;
    inside_ = true;
    node_.clear();
    return true;
  }
  const bool rule = !l.empty() && l.find_first_not_of('=') == std::string::npos;
  if (rule || (start == 0 && l.find(" JOB MAP ") == std::string::npos)) {
    inside_ = false;
    complete_ = true;
    return rule;
  }
  if (complete_) return true;
  std::string rank;
  if (l.rfind("Data for node:", 0) == 0) node_ = word_after(l, "Data for node:");
  else if (const std::string r = word_after(l, "Process rank:"); !r.empty()) rank = r;
  else if (const std::string p = word_after(l, "Data for proc:"); !p.empty() && p.back() == ']')  // [[J,1],R]
    rank = p.substr(p.rfind(',') + 1, p.size() - p.rfind(',') - 2);
  char* end = nullptr;
  const long r = rank.empty() ? -1 : std::strtol(rank.c_str(), &end, 10);
  if (!node_.empty() && r >= 0 && *end == '\0' && r < (1L << 30)) node_of_rank_[static_cast<int>(r)] = node_;
  return true;
}

namespace {
// node7 and node7.cluster.internal; not two addresses of one /8.
bool one_is_short_for_other(const std::string& a, const std::string& b) {
  return a.substr(0, a.find('.')) == b || b.substr(0, b.find('.')) == a;
}
}  // namespace

RankPlacement place_ranks(const HostList& placement, const std::map<int, std::string>& node_of_rank) {
  RankPlacement p;
  p.hosts = rank_hosts(placement);
  std::vector<std::string> nodes;
  for (const auto& [rank, node] : node_of_rank)
    if (std::find(nodes.begin(), nodes.end(), node) == nodes.end()) nodes.push_back(node);
  std::vector<bool> used(placement.size(), false);
  const auto match = [&](const std::string& node, auto&& same) {
    for (size_t i = 0; i < placement.size(); ++i)
      if (!used[i] && same(node, placement[i].name)) {
        used[i] = true;
        p.host_of_node[node] = placement[i].name;
        return;
      }
  };
  const auto exact = [](const std::string& n, const std::string& h) { return n == h; };
  const auto local = [](const std::string& n, const std::string& h) { return is_local_host(n) && is_local_host(h); };
  for (const auto& same : {+exact, +one_is_short_for_other, +local})
    for (const std::string& node : nodes)
      if (!p.host_of_node.count(node)) match(node, same);
  std::vector<std::string> unmatched;
  for (const std::string& node : nodes)
    if (!p.host_of_node.count(node)) unmatched.push_back(node);
  if (unmatched.size() == 1 && std::count(used.begin(), used.end(), false) == 1)
    match(unmatched.front(), [](const std::string&, const std::string&) { return true; });
  else if (!unmatched.empty()) {
    p.problem = "mpirun's process map names node " + unmatched.front() + ", which is none of -H's hosts";
    return p;
  }
  std::vector<std::string> hosts(p.hosts.size());
  for (size_t r = 0; r < hosts.size(); ++r) {
    const auto node = node_of_rank.find(static_cast<int>(r));
    if (node == node_of_rank.end()) {
      p.problem = node_of_rank.empty() ? "mpirun printed no process map"
                                       : "mpirun's process map does not place rank " + std::to_string(r);
      return p;
    }
    hosts[r] = p.host_of_node.at(node->second);
  }
  p.hosts = std::move(hosts);
  return p;
}

bool crashed(const RankReport& r) {
  if (r.terminated || r.status.exited) return false;
  switch (r.status.signal) {
    case SIGQUIT: case SIGILL: case SIGTRAP: case SIGABRT: case SIGBUS: case SIGFPE: case SIGSEGV: case SIGSYS:
    case SIGXCPU: case SIGXFSZ:
      return true;
    default: return false;
  }
}

bool failed_by_itself(const RankReport& r) {
  if (r.terminated) return false;
  if (r.stop_requested) return crashed(r);
  if (!r.status.exited) return true;  // a crash, or a kill from outside mpirun
  // 124: the trainer's watchdog gave up waiting for a peer: the peer is the culprit, not this rank.
  const int c = r.status.code;
  return c != kExitSuccess && c != kExitCheckpointed && c != kExitStepTimeout;
}

bool is_usage_error(const RankReport& r) {
  return r.status.exited && r.status.code == kExitUsage && !r.terminated && !r.stop_requested;
}

namespace {

std::string trimmed(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r");
  return b == std::string::npos ? "" : s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

bool mentions_error(const std::string& line) {
  std::string lower = line;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  return lower.find("error") != std::string::npos;
}

}  // namespace

void keep_error_line(std::string& kept, const std::string& line) {
  const std::string l = trimmed(line);
  if (!l.empty() && (kept.empty() || mentions_error(l) || !mentions_error(kept))) kept = l;
}

std::string mpirun_complaint(const std::string& output) {
  std::istringstream in(output);
  std::string out;
  bool details = false;  // past the first paragraph: only its indented "Key: value" lines
  for (std::string line; std::getline(in, line);) {
    const std::string l = trimmed(line);
    if (l.find_first_not_of('-') == std::string::npos) {  // a rule or an empty line
      if (out.empty()) continue;
      if (!l.empty() || details) break;  // the message ended
      details = true;
      continue;
    }
    if (details && (line.find(':') == std::string::npos || line[0] != ' ')) break;
    out += (out.empty() ? "" : " ") + l;
  }
  if (out.size() > 400) out = out.substr(0, 397) + "...";
  return out.empty() ? "(it said nothing)" : out;
}

std::string host_blamed_by_mpirun(const std::string& line) {
  const auto word_after = [&](const std::string& key) { return launch::word_after(line, key); };
  if (line.find("Remote daemon:") != std::string::npos) return word_after(" on node ");
  if (line.find("Peer host:") != std::string::npos) return word_after("Peer host:");
  if (line.find("noticed that process rank") != std::string::npos) return word_after(" on node ");
  // ssh, as mpirun's launch agent, about the host it could not start a daemon on (or lost).
  if (line.rfind("ssh: connect to host ", 0) == 0) return word_after("connect to host ");
  if (line.rfind("ssh: Could not resolve hostname ", 0) == 0) {
    const std::string host = word_after("hostname ");
    return host.empty() || host.back() != ':' ? host : host.substr(0, host.size() - 1);
  }
  if (line.rfind("Host key for ", 0) == 0 && line.find(" has changed") != std::string::npos) return word_after("Host key for ");
  if (line.find(" host key is known for ") != std::string::npos) return word_after(" host key is known for ");
  if (line.rfind("Connection to ", 0) == 0 && (line.find(" timed out") != std::string::npos ||
                                              line.find(" closed by remote host") != std::string::npos))
    return word_after("Connection to ");
  return "";
}

bool names_a_process_end(const std::string& line) {
  return line.find("noticed that process rank") != std::string::npos || line.find("Peer host:") != std::string::npos;
}

bool says_daemons_not_started(const std::string& line) {
  return line.find("was unable to reliably start one or more daemons") != std::string::npos;
}

std::string first_said(const std::string& output) {
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    const std::string l = trimmed(line);
    if (l.find_first_not_of('-') != std::string::npos) return l.size() > 300 ? l.substr(0, 297) + "..." : l;
  }
  return "(it said nothing)";
}

std::string executable_named_by_mpirun(const std::string& line) {
  const std::string l = trimmed(line);
  // Open MPI 4: "Executable: X" (not found), "Application name: X" (its execve failed).
  for (const std::string key : {"Executable:", "Application name:"})
    if (l.rfind(key, 0) == 0) return trimmed(l.substr(key.size()));
  return "";
}

std::string listed(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

namespace {

// mpirun's 0 alone is not enough: signalled while it was still starting the job, Open MPI 4 was
// seen to end with 0 before any rank ran. Success is every rank's own report of 0.
Analysis judge_clean_exit(int np, const AttemptEvidence& e) {
  std::vector<bool> finished(static_cast<size_t>(np), false);
  for (const RankReport& r : e.reports)
    if (r.rank >= 0 && r.rank < np && r.status.exited && r.status.code == 0) finished[static_cast<size_t>(r.rank)] = true;
  std::string missing;
  int n_missing = 0;
  for (int r = 0; r < np; ++r)
    if (!finished[static_cast<size_t>(r)] && ++n_missing <= 4) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  Analysis a;
  if (n_missing == 0) {
    a.verdict = Verdict::Success;
    a.reason = "every rank finished";
    return a;
  }
  if (n_missing > 4) missing += ", ...";
  a.verdict = e.stop_requested ? Verdict::Stopped : Verdict::Failure;
  a.reason = "mpirun ended with exit code 0, but rank(s) " + missing + " never reported finishing";
  return a;
}

std::optional<Analysis> usage_error_of(const AttemptEvidence& e) {
  const auto first = std::find_if(e.reports.begin(), e.reports.end(), is_usage_error);
  if (first == e.reports.end()) return std::nullopt;
  Analysis a;
  a.verdict = Verdict::UsageError;
  a.reason = "rank " + std::to_string(first->rank) + " reported a usage error (exit code 2): its input is wrong, retrying cannot help";
  // MPI programs often print an error on rank 0 alone while every rank exits with 2.
  for (const RankReport& other : e.reports) {
    const auto said = e.error_lines.find(other.rank);
    if (is_usage_error(other) && said != e.error_lines.end()) {
      a.program_error = said->second;
      break;
    }
  }
  return a;
}

// A rank that crashed in the stop, on a host that stays in the job: a failure, not a stop.
bool crashed_in_stop(const std::vector<std::string>& hosts, const AttemptEvidence& e) {
  return std::any_of(e.reports.begin(), e.reports.end(), [&](const RankReport& r) {
    const bool placed = r.rank >= 0 && r.rank < static_cast<int>(hosts.size());
    return crashed(r) && !(placed && e.leaving.count(hosts[static_cast<size_t>(r.rank)]));
  });
}

std::optional<Analysis> stop_of(const std::vector<std::string>& hosts, const AttemptEvidence& e) {
  if (e.stalled) return std::nullopt;
  const ExitStatus& st = e.mpirun_status;
  bool all_checkpointed = st.exited && st.code == kExitCheckpointed;
  for (const RankReport& r : e.reports)
    if (!(r.status.exited && r.status.code == kExitCheckpointed)) all_checkpointed = false;
  Analysis a;
  if (all_checkpointed) {
    a.verdict = e.stop_requested ? Verdict::Stopped : Verdict::StoppedOutside;
    a.reason = e.stop_requested ? "checkpointed and stopped as asked"
                                : "the job checkpointed and stopped on a signal from outside hpcrun";
    return a;
  }
  if (!e.stop_requested) return std::nullopt;
  if (e.killed_on_request) {  // no checkpoint of this stop: not "stopped", whatever the ranks' ends
    a.verdict = Verdict::Failure;
    a.reason = "killed on request by a second signal before the job's checkpoint (" + st.show() + ")";
    return a;
  }
  // A crash is judged as any failure: blamed, counted against --max-restarts. The hosts a drain
  // takes out of the job may end as they will.
  if (crashed_in_stop(hosts, e)) return std::nullopt;
  a.verdict = Verdict::Stopped;
  a.reason = "stopped as asked (" + st.show() + ", not a checkpoint's exit code 75)";
  return a;
}

// What the ranks' reports say: which hosts were heard from (a report, or the wrapper's word that
// mpirun's teardown reached it), and the first rank that failed by itself.
struct Heard {
  std::map<std::string, bool> reported;  // host -> any of its ranks reported
  std::string first_failure, first_host;
};

Heard read_reports(const std::vector<std::string>& hosts, const AttemptEvidence& e) {
  Heard h;
  const int np = static_cast<int>(hosts.size());
  for (const std::string& host : hosts) h.reported.emplace(host, false);
  for (int r : e.signalled)
    if (r >= 0 && r < np) h.reported[hosts[static_cast<size_t>(r)]] = true;
  for (const RankReport& r : e.reports) {
    if (r.rank < 0 || r.rank >= np) continue;
    const std::string& host = hosts[static_cast<size_t>(r.rank)];
    h.reported[host] = true;
    if (h.first_failure.empty() && failed_by_itself(r)) {
      h.first_host = host;
      h.first_failure = "rank " + std::to_string(r.rank) + " on " + host + " ended with " + r.status.show();
    }
  }
  return h;
}

// The placement's hosts mpirun named (by its name for the host in the process map, or by full or
// short name), each once.
std::vector<std::string> named_by_mpirun(const std::vector<std::string>& hosts, const AttemptEvidence& e,
                                         const std::vector<std::string>& names) {
  std::vector<std::string> named;
  for (const std::string& b : names)
    for (const std::string& h : hosts) {
      const auto mapped = e.host_of_node.find(b);
      const bool same = mapped != e.host_of_node.end()
                            ? mapped->second == h
                            : h == b || one_is_short_for_other(h, b);
      if (same && std::find(named.begin(), named.end(), h) == named.end()) named.push_back(h);
    }
  return named;
}

// Hosts none of whose ranks answered the liveness query, by name.
std::vector<std::string> not_answering(const std::vector<std::string>& hosts, const std::set<int>& alive) {
  std::map<std::string, bool> answered;
  for (const std::string& h : hosts) answered.emplace(h, false);
  for (int r : alive)
    if (r >= 0 && r < static_cast<int>(hosts.size())) answered[hosts[static_cast<size_t>(r)]] = true;
  std::vector<std::string> out;
  for (const auto& [host, did] : answered)
    if (!did) out.push_back(host);
  return out;
}

// Hosts none of whose ranks reported, where another host's did.
std::vector<std::string> silent_hosts(const std::map<std::string, bool>& reported) {
  std::vector<std::string> out;
  const bool anyone = std::any_of(reported.begin(), reported.end(), [](const auto& kv) { return kv.second; });
  if (anyone)
    for (const auto& [host, did] : reported)
      if (!did) out.push_back(host);
  return out;
}

Analysis blame_failure(const std::vector<std::string>& hosts, const AttemptEvidence& e) {
  const Heard heard = read_reports(hosts, e);
  // mpirun's own words first: when it names hosts, the others' silence only means the teardown
  // was too quick for their reports to come through. A stalled job's liveness query outranks
  // silence: a host whose ranks answered it was alive, and its reports were only lost in the
  // teardown (those that did not answer are blamed).
  const std::vector<std::string> named = named_by_mpirun(hosts, e, e.blamed_by_mpirun);
  const bool query_answered = e.stalled && !e.alive.empty();
  std::vector<std::string> unresponsive, silent;
  if (named.empty() && query_answered) unresponsive = not_answering(hosts, e.alive);
  if (named.empty() && !query_answered) silent = silent_hosts(heard.reported);
  Analysis a;
  a.verdict = Verdict::Failure;
  a.failed_hosts.insert(named.begin(), named.end());
  a.failed_hosts.insert(unresponsive.begin(), unresponsive.end());
  a.failed_hosts.insert(silent.begin(), silent.end());
  if (a.failed_hosts.empty() && !heard.first_host.empty()) a.failed_hosts.insert(heard.first_host);
  // mpirun names the host of a rank that died ("noticed that process rank R ... exited on signal
  // N", "Peer host: H"), lost or not: where it named no host for anything else (a lost daemon) and
  // that rank's own report came, the report says what happened.
  std::vector<std::string> for_more = e.blamed_by_mpirun;
  for (const std::string& d : e.process_ends_by_mpirun)
    if (const auto at = std::find(for_more.begin(), for_more.end(), d); at != for_more.end()) for_more.erase(at);
  const bool only_a_death = !named.empty() && named_by_mpirun(hosts, e, for_more).empty() &&
                            std::find(named.begin(), named.end(), heard.first_host) != named.end();
  if (only_a_death) a.reason = heard.first_failure;
  else if (!named.empty()) a.reason = "lost " + listed(named) + " (named by mpirun)";
  else if (!unresponsive.empty()) a.reason = "lost " + listed(unresponsive) + " (its ranks did not answer)";
  else if (!silent.empty()) a.reason = "lost " + listed(silent) + " (no word from its ranks)";
  else a.reason = heard.first_failure;
  if (a.reason.empty())
    a.reason = !e.stalled            ? "mpirun ended with " + e.mpirun_status.show()
               : e.stalled_starting ? std::string("the job stalled (no first step within --start-timeout)")
                                    : std::string("the job stalled (no finished step within --stall-timeout)");
  else if (e.stalled)
    a.reason = "the job stalled; " + a.reason;
  return a;
}

}  // namespace

Analysis analyse_attempt(const HostList& placement, const AttemptEvidence& e) {
  const std::vector<std::string> hosts = e.rank_hosts.empty() ? rank_hosts(placement) : e.rank_hosts;
  if (e.mpirun_status.success()) return judge_clean_exit(static_cast<int>(hosts.size()), e);
  if (std::optional<Analysis> a = usage_error_of(e)) return *a;
  if (!e.foreign_executable.empty()) {
    Analysis a;
    a.verdict = Verdict::UsageError;
    a.reason = "mpirun took '" + e.foreign_executable +
               "' for the program to run (it runs the first word it does not know as an option): a word of "
               "--mpi-args that is no option's value?";
    return a;
  }
  if (std::optional<Analysis> a = stop_of(hosts, e)) return *a;
  return blame_failure(hosts, e);
}

}  // namespace hpc::launch

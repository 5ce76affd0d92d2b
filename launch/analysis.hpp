// What an attempt's end means, from how mpirun ended and what each rank's wrapper reported.
// Pure, so every case is unit-tested (tests/unit/launch_test.cpp).
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "hosts.hpp"
#include "rank_report.hpp"

namespace hpc::launch {

enum class Verdict {
  Success,        // every rank finished
  Stopped,        // hpcrun asked for a checkpoint-and-stop and the job did it
  StoppedOutside, // the job checkpointed and stopped on a signal hpcrun did not send (Slurm, a spot watcher)
  UsageError,     // the program rejected its input (exit code 2): retrying cannot help
  Failure,        // anything else: relaunch from the last checkpoint
};

struct Analysis {
  Verdict verdict = Verdict::Failure;
  std::set<std::string> failed_hosts;  // hosts to blame (blacklisted by the caller)
  std::string reason;                  // one line
  std::string program_error;           // UsageError: the failing rank's own error line, if it printed one
};

// Which host each rank runs on where mpirun's process map does not say: mpirun -H h1:s1,h2:s2
// fills h1's slots first, then h2's.
std::vector<std::string> rank_hosts(const HostList& placement);

// The process map mpirun prints on its stdout before it starts the ranks (--display-map; Open MPI
// 4: " Data for node: NAME\tNum slots: ..." and under it "Process OMPI jobid: [..] App: 0 Process
// rank: R Bound: ..."; --display-devel-map's "Data for proc: [[J,1],R]" too): the node of each rank,
// by mpirun's name for it. The slot order above is not where Open MPI puts them: its own host comes
// first wherever -H lists it (-H b:1,localhost:1: rank 0 on this machine), and --map-by node,
// --rank-by node or a rankfile interleave the hosts.
class ProcessMap {
 public:
  // One of mpirun's own stdout lines: whether it is one of a map's. A map runs from its "Data for
  // JOB" or "JOB MAP" header to its closing rule ("=====") or, where it has none (the devel map),
  // to the first line that is not indented, which is not the map's. Only the first map counts:
  // with an rsh launch agent the daemons print theirs too, after it, and maybe interleaved.
  bool take(const std::string& line);
  bool complete() const { return complete_; }  // the first map has ended
  const std::map<int, std::string>& node_of_rank() const { return node_of_rank_; }

 private:
  bool inside_ = false, complete_ = false;
  std::string node_;
  std::map<int, std::string> node_of_rank_;
};

// The placement's host of each rank (`hosts`, by rank) and of each node the map names
// (`host_of_node`), matching mpirun's node names to the placement's: the same name, or the same
// short name, or this machine (which Open MPI names by its host name, given as localhost or an
// address), or, where one node and one host are left unmatched, each other. Where the map does not
// place every one of the placement's ranks on a node matched so, `hosts` is the slot order and
// `problem` says why.
struct RankPlacement {
  std::vector<std::string> hosts;
  std::map<std::string, std::string> host_of_node;
  std::string problem;
};
RankPlacement place_ranks(const HostList& placement, const std::map<int, std::string>& node_of_rank);

// The host an mpirun message blames, or "": Open MPI 4 names a lost daemon ("Remote daemon: ...
// on node H"), a vanished peer ("Peer host: H") and a rank that died ("noticed that process rank
// R ... on node H exited"); ssh as its launch agent names a host it cannot reach or trust ("ssh:
// connect to host H port 22: Connection refused", "Host key for H has changed ...", "Connection to
// H closed by remote host."). Used beside the ranks' reports, which a torn-down job may never deliver.
std::string host_blamed_by_mpirun(const std::string& line);

// What mpirun said when it refused its command line, on one line: the first paragraph of its first
// message and the "Key: value" lines under it ("The specified binding policy is not recognized:
// Policy: bogus"), not the boilerplate that follows.
std::string mpirun_complaint(const std::string& output);

// A rank's stderr, kept as the line that best says why it failed: the latest one, except that a
// line mentioning an error is not displaced by later lines that do not.
void keep_error_line(std::string& kept, const std::string& line);

// What hpcrun saw of an attempt.
struct AttemptEvidence {
  std::vector<RankReport> reports;            // in the order they arrived
  std::vector<std::string> blamed_by_mpirun;  // host_blamed_by_mpirun() of mpirun's lines
  // Those of them named for a process there (names_a_process_end), not for the host's own loss.
  std::vector<std::string> process_ends_by_mpirun;
  std::set<int> alive;                        // ranks that answered the liveness query of a stalled job
  std::set<int> signalled;                    // ranks whose wrapper said mpirun's teardown reached it
  std::map<int, std::string> error_lines;     // keep_error_line() of each rank's stderr
  ExitStatus mpirun_status;
  bool stop_requested = false;  // hpcrun asked the job to checkpoint and stop
  bool killed_on_request = false;  // then a second signal: hpcrun killed the job (SIGTERM to mpirun)
  bool stalled = false;         // hpcrun killed it for a heartbeat stall
  bool stalled_starting = false;  // the stall came before the first step (--start-timeout)
  // The hosts a requested stop drains the job off (a straggler, a host that left the discovery
  // output): how their ranks end in the stop is no failure of the job.
  std::set<std::string> leaving;
  // Where each rank ran and mpirun's names for those hosts, from its process map (place_ranks);
  // the slot order where the map could not be read; empty: not placed (no map, no rank heard
  // from), and the ranks are taken to be in slot order (rank_hosts).
  std::vector<std::string> rank_hosts;
  std::map<std::string, std::string> host_of_node;
  // mpirun said it could not start its daemon on some host (says_daemons_not_started).
  bool daemons_not_started = false;
  // The program mpirun failed to start where it is not hpcrun's rank wrapper: it took another word for the
  // program (a word of --mpi-args that is no option's value), which no relaunch can mend.
  std::string foreign_executable;
};

// Blame, in order of trust: the hosts mpirun named; for a stalled job, the hosts none of whose
// ranks answered the liveness query (stopped, hung in the kernel, cut off) when others did; the
// hosts that went silent while others could still report (lost with their processes, or cut off
// the network); else the host of the first rank that failed by itself (the ranks failing after
// it are usually its victims: their peer vanished from a collective).
Analysis analyse_attempt(const HostList& placement, const AttemptEvidence& e);

// "a, b, c": host names in a line.
std::string listed(const std::vector<std::string>& names);

// mpirun's line names a host for a process there that ended ("noticed that process rank R ... on
// node H exited") or whose connection dropped ("Peer host: H", after a peer's crash as after a
// host's loss), not for the host's own loss ("Remote daemon: ... on node H", ssh's words).
bool names_a_process_end(const std::string& line);

// mpirun's account that it could not start its daemon on some host, which names none (Open MPI 4:
// "ORTE was unable to reliably start one or more daemons.").
bool says_daemons_not_started(const std::string& line);
// The first line a failed mpirun wrote that is not a rule: its launch agent's or daemon's own words
// where they came first ("bash: orted: command not found", "orted: error while loading shared
// libraries: ..."), else the first line of its message; "(it said nothing)" where it wrote none.
std::string first_said(const std::string& output);

// The program mpirun names in its account of a launch that failed ("  Executable: X", "  Application
// name: X"), else "".
std::string executable_named_by_mpirun(const std::string& line);

// A report that shows this rank failed by itself rather than being torn down with the job. After a
// stop request only a crash counts (crashed()): the ranks' other ends are the stop's.
bool failed_by_itself(const RankReport& r);
// The rank's program died of a signal that no stop or teardown sends (SIGSEGV, SIGABRT, SIGBUS,
// SIGFPE, SIGILL, ...: those whose default action dumps core), before the teardown reached it.
bool crashed(const RankReport& r);
// The program rejected its input (exit code 2, not while being stopped): retrying cannot help.
bool is_usage_error(const RankReport& r);

}  // namespace hpc::launch

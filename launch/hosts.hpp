// Where a job may run: hosts and their slots (one rank per slot), from the forms users already
// write for Open MPI, Horovod and Slurm. Every parser validates; bad input is a usage error
// naming the source and the offending text.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace hpc::launch {

struct Host {
  std::string name;
  int slots = 1;
  bool operator==(const Host&) const = default;
};
using HostList = std::vector<Host>;

// The most slots a host may have (host:slots, slots=N, --slots-per-host).
constexpr int kMaxSlots = 4096;
// The most slots (ranks) one host list may have in all: every parser refuses more, so slot
// counts never overflow an int.
constexpr int kMaxTotalSlots = 1 << 20;

// "-H a:2,b,c:4": comma-separated host[:slots]; a host without slots gets `default_slots`.
HostList parse_host_list(const std::string& spec, int default_slots);
// Open MPI's hostfile: "host [slots=N] [max_slots=M]" per line, '#' comments.
HostList parse_hostfile(const std::string& path, int default_slots);
// A discovery script's output: one "host:slots" (or "host") per line. `source` names it.
HostList parse_discovery_output(const std::string& text, int default_slots, const std::string& source);
// Slurm's compressed forms: SLURM_JOB_NODELIST "gpu[01-03,07],login1" and
// SLURM_TASKS_PER_NODE "2(x3),1".
std::vector<std::string> expand_slurm_nodelist(const std::string& list);
std::vector<int> expand_slurm_tasks_per_node(const std::string& tasks);
HostList slurm_hosts(const std::string& nodelist, const std::string& tasks_per_node);
// The inverse, for mpirun inside a Slurm job: the variables (name, value) through which Open MPI
// reads the allocation, narrowed to `hosts`. Otherwise mpirun starts its daemons (through srun)
// on every node of the allocation, a lost one included, and waits for that one forever.
std::vector<std::pair<std::string, std::string>> slurm_allocation_env(const HostList& hosts);

// When Slurm chose the job whose `scontrol show job -o` record is given for preemption: its
// PreemptTime ("2026-11-23T14:30:12"), or "" when it was not ("None", absent). Slurm then signals
// every step's processes (mpirun's daemons too, which end the ranks) and requeues or cancels the
// job after the partition's GraceTime: not a host failure to relaunch from.
std::string slurm_preempt_time(const std::string& scontrol_record);

int total_slots(const HostList& hosts);
bool has_host(const HostList& hosts, const std::string& name);
// The host of that name in `hosts`; nullptr when there is none.
const Host* find_host(const HostList& hosts, const std::string& name);
// "a:2,b:1", as -H takes it.
std::string show_hosts(const HostList& hosts);
// A name this machine itself answers to (localhost, 127.x, its host name): no launch agent
// is needed to reach it.
bool is_local_host(const std::string& name);
// True when `name` resolves to an address (getaddrinfo); `why` says why not.
bool resolves(const std::string& name, std::string* why);

}  // namespace hpc::launch

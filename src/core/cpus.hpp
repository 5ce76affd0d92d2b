// The CPUs a process may use, as the kernel limits them: its affinity mask (taskset, mpirun
// --bind-to, a Slurm task's cpuset) and its cgroup's CPU quota (cgroup v2 cpu.max, v1
// cpu.cfs_quota_us: docker --cpus, systemd CPUQuota=). The host's core count says neither: a
// thread pool sized by it oversubscribes the CPUs a bound or limited process really has.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace hpc::cpus {

// The ids of the CPUs this process may run on (sched_getaffinity).
std::vector<int> affinity();

// The tightest CPU quota, in CPUs (1.5 = 150 ms per 100 ms), along this process's cgroup path
// and its ancestors; nullopt when none is set or cgroups cannot be read. `proc_cgroup` and
// `cgroup_root` are /proc/self/cgroup and /sys/fs/cgroup, other files for the tests.
std::optional<double> cgroup_quota(const std::string& proc_cgroup = "/proc/self/cgroup",
                                   const std::string& cgroup_root = "/sys/fs/cgroup");

// The tightest memory limit in bytes along the same path (cgroup v2 memory.max, v1
// memory.limit_in_bytes: a Slurm job's --mem, docker --memory), which also counts what the
// process writes to a tmpfs; nullopt when none is set.
std::optional<double> cgroup_memory_limit(const std::string& proc_cgroup = "/proc/self/cgroup",
                                          const std::string& cgroup_root = "/sys/fs/cgroup");

// The host's memory, or the cgroup's memory limit (above) where that is smaller.
uint64_t host_memory_bytes();
// A memory size as an option gives it (--snapshot-max-memory): "25%" of host_memory, or bytes
// ("512M", "4G", "1.5T", "65536"). A usage error naming the option otherwise.
uint64_t memory_size(const std::string& spec, uint64_t host_memory, const char* option);

// The CPU's model name, as /proc/cpuinfo gives it ("AMD EPYC 9R14 96-Core Processor"); "" when
// it says none.
std::string model_name(const std::string& cpuinfo = "/proc/cpuinfo");

// What this process alone may use: the affinity's CPUs, no more than the quota (at least 1).
int usable();

// One process's share of CPUs that several processes on a host may run on: each CPU of its mask
// counts 1/k when k of the masks hold it (two ranks bound to the same socket share its cores; two
// bound to their own cores each have theirs). masks[me] is this process's.
double fair_share(const std::vector<std::vector<int>>& masks, size_t me);

}  // namespace hpc::cpus

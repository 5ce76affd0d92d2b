#include "core/cpus.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "core/error.hpp"

namespace hpc::cpus {
namespace {

std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// cgroup v2: cpu.max is "QUOTA PERIOD" in microseconds, QUOTA "max" for none.
std::optional<double> v2_quota(const std::string& dir) {
  std::istringstream in(first_line(dir + "/cpu.max"));
  std::string quota;
  double period = 0;
  if (!(in >> quota >> period) || quota == "max" || period <= 0) return std::nullopt;
  try {
    return std::stod(quota) / period;
  } catch (...) {
    return std::nullopt;
  }
}

// cgroup v1: cpu.cfs_quota_us (-1 for none) over cpu.cfs_period_us.
std::optional<double> v1_quota(const std::string& dir) {
  try {
    const double quota = std::stod(first_line(dir + "/cpu.cfs_quota_us"));
    const double period = std::stod(first_line(dir + "/cpu.cfs_period_us"));
    if (quota > 0 && period > 0) return quota / period;
  } catch (...) {
  }
  return std::nullopt;
}

// The tightest quota on `path` and each of its ancestors below `mount` (a limit set on a parent
// binds its children too). Inside a container the path may name the host's hierarchy, which is
// then mounted as the root: the mount point itself is read as well.
std::optional<double> tightest(const std::string& mount, std::string path,
                               std::optional<double> (*read)(const std::string&)) {
  std::optional<double> best;
  auto take = [&](std::optional<double> q) {
    if (q && (!best || *q < *best)) best = q;
  };
  for (;;) {
    take(read(mount + path));
    if (path.empty() || path == "/") break;
    path = path.substr(0, path.rfind('/'));
  }
  return best;
}

}  // namespace

std::vector<int> affinity() {
  // A set as large as the kernel's: cpu_set_t holds 1024 CPUs, and sched_getaffinity refuses a
  // set smaller than the machine's possible CPUs (EINVAL), so it grows until it fits.
  for (int n = CPU_SETSIZE; n <= (1 << 20); n *= 2) {
    cpu_set_t* set = CPU_ALLOC(n);
    const size_t size = CPU_ALLOC_SIZE(n);
    CPU_ZERO_S(size, set);
    std::vector<int> ids;
    const bool ok = sched_getaffinity(0, size, set) == 0;
    for (int c = 0; ok && c < n; ++c)
      if (CPU_ISSET_S(c, size, set)) ids.push_back(c);
    const bool too_small = !ok && errno == EINVAL;
    CPU_FREE(set);
    if (ok) return ids;
    if (!too_small) break;
  }
  std::vector<int> all(std::max(1u, std::thread::hardware_concurrency()));  // cannot tell: the host's
  for (size_t c = 0; c < all.size(); ++c) all[c] = static_cast<int>(c);
  return all;
}

namespace {

using Reader = std::optional<double> (*)(const std::string&);

// The tightest limit along this process's cgroups: v2's (reader2 on the unified hierarchy) and
// v1's of the controller `v1` (reader1 under the directory named after its controllers).
std::optional<double> tightest_limit(const std::string& proc_cgroup, const std::string& cgroup_root,
                                     const char* v1, Reader reader2, Reader reader1) {
  // Lines "ID:CONTROLLERS:PATH": v2 has "0::PATH"; v1 names its controllers and is mounted
  // under a directory named after them (cpu,cpuacct).
  std::ifstream in(proc_cgroup);
  std::optional<double> best;
  for (std::string line; std::getline(in, line);) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    std::optional<double> q;
    if (controllers.empty()) {
      q = tightest(cgroup_root, path, reader2);
    } else {
      std::istringstream names(controllers);
      bool named = false;
      for (std::string n; std::getline(names, n, ',');) named = named || n == v1;
      if (named) q = tightest(cgroup_root + "/" + controllers, path, reader1);
    }
    if (q && (!best || *q < *best)) best = q;
  }
  return best;
}

// cgroup v2: memory.max in bytes, "max" for none.
std::optional<double> v2_memory(const std::string& dir) {
  const std::string v = first_line(dir + "/memory.max");
  try {
    return v.empty() || v == "max" ? std::nullopt : std::optional<double>(std::stod(v));
  } catch (...) {
    return std::nullopt;
  }
}

// cgroup v1: memory.limit_in_bytes, a huge number (about 2^63) for none.
std::optional<double> v1_memory(const std::string& dir) {
  try {
    const double v = std::stod(first_line(dir + "/memory.limit_in_bytes"));
    if (v > 0 && v < 4e18) return v;
  } catch (...) {
  }
  return std::nullopt;
}

}  // namespace

std::optional<double> cgroup_quota(const std::string& proc_cgroup, const std::string& cgroup_root) {
  return tightest_limit(proc_cgroup, cgroup_root, "cpu", v2_quota, v1_quota);
}

std::optional<double> cgroup_memory_limit(const std::string& proc_cgroup, const std::string& cgroup_root) {
  return tightest_limit(proc_cgroup, cgroup_root, "memory", v2_memory, v1_memory);
}

int usable() {
  double n = static_cast<double>(affinity().size());
  if (const auto q = cgroup_quota()) n = std::min(n, std::ceil(*q));
  return std::max(1, static_cast<int>(n));
}

double fair_share(const std::vector<std::vector<int>>& masks, size_t me) {
  std::map<int, int> holders;
  for (const auto& m : masks)
    for (int c : m) ++holders[c];
  double share = 0;
  for (int c : masks.at(me)) share += 1.0 / holders[c];
  return share;
}

std::string model_name(const std::string& cpuinfo) {
  std::ifstream in(cpuinfo);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const size_t from = line.find_first_not_of(" \t", colon + 1);
    return from == std::string::npos ? "" : line.substr(from);
  }
  return "";
}

uint64_t host_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), size = ::sysconf(_SC_PAGE_SIZE);
  uint64_t bytes = pages > 0 && size > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(size) : 0;
  // A job's memory limit (Slurm's --mem, a container's) counts the snapshots' tmpfs pages too:
  // a share of the host would let them push the job over it.
  if (const std::optional<double> limit = cgroup_memory_limit())
    bytes = std::min<uint64_t>(bytes, static_cast<uint64_t>(*limit));
  return bytes;
}

uint64_t memory_size(const std::string& spec, uint64_t host_memory, const char* option) {
  size_t used = 0;
  double v = -1;
  try {
    v = std::stod(spec, &used);
  } catch (...) {
    used = 0;
  }
  const std::string unit = spec.substr(std::min(used, spec.size()));
  static const std::pair<const char*, double> kUnits[] = {{"", 1.0},          {"K", 1024.0},
                                                          {"M", 1048576.0},   {"G", 1073741824.0},
                                                          {"T", 1099511627776.0}};
  if (used > 0 && std::isfinite(v) && v >= 0) {
    if (unit == "%" && v <= 100) return static_cast<uint64_t>(static_cast<double>(host_memory) * v / 100);
    for (const auto& [name, factor] : kUnits)
      if (unit == name && v * factor < 1.8e19) return static_cast<uint64_t>(v * factor);
  }
  usage_error(option, " takes a size (512M, 4G: bytes with K, M, G or T) or a share of the host's "
              "memory (25%), got '", spec, "'");
}

}  // namespace hpc::cpus

#include "dist/process.hpp"

#include <algorithm>

#include "core/cpus.hpp"
#include "core/log.hpp"

namespace hpc::dist {

int default_threads(const ProcessContext& ctx) {
  // The rank's share of the CPUs it may run on; a cgroup's quota binds all the ranks in it.
  double cpus = ctx.cpu_share();
  const auto quota = cpus::cgroup_quota();
  if (quota) cpus = std::min(cpus, *quota / std::max(1, ctx.local_size()));
  log::debug("threads: this rank's share of its CPUs ", ctx.cpu_share(), " (", cpus::affinity().size(),
             " in its affinity mask, ", ctx.local_size(), " rank(s) on the host), cgroup quota ",
             quota ? detail::concat(*quota, " CPUs") : std::string("none"));
  return std::max(1, static_cast<int>(cpus));
}

}  // namespace hpc::dist

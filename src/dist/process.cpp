#include "dist/process.hpp"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>

#include "core/cpus.hpp"
#include "core/log.hpp"

namespace hpc::dist {

namespace {
// OMP_NUM_THREADS when it is set to a number of threads (the first of a list: OpenMP's nested
// levels), which --threads overrides; a value that is none is a warning and is left aside.
std::optional<int> omp_num_threads() {
  const char* v = std::getenv("OMP_NUM_THREADS");
  if (!v || !*v) return std::nullopt;
  const std::string text(v);
  const std::string first = text.substr(0, text.find(','));
  size_t used = 0;
  int n = 0;
  try {
    n = std::stoi(first, &used);
  } catch (...) {
    used = 0;
  }
  if (used == first.size() && used > 0 && n >= 1 && n <= 4096) return n;
  log::warn("OMP_NUM_THREADS='", text, "' is not a number of threads (1 to 4096): left aside, the threads are chosen "
            "as without it");
  return std::nullopt;
}

}  // namespace

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

int math_threads(const ProcessContext& ctx, int given) {
  if (given > 0) return given;
  if (const std::optional<int> n = omp_num_threads()) return *n;
  return default_threads(ctx);
}

}  // namespace hpc::dist

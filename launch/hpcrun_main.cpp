// hpcrun: parse the options, run the supervisor, turn errors into one line and an exit code.
// `hpcrun --rank-exec PROGRAM ARGS...` is the per-rank wrapper mpirun starts (rank_report.hpp).
#include <cstdio>
#include <cstring>
#include <exception>

#include "core/error.hpp"
#include "options.hpp"
#include "rank_report.hpp"
#include "supervisor.hpp"

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--rank-exec") == 0) return hpc::launch::rank_exec_main(argc - 2, argv + 2);
  try {
    std::optional<hpc::launch::LaunchOptions> options = hpc::launch::parse_launch_options(argc, argv);
    if (!options) return 0;
    hpc::launch::Supervisor supervisor(std::move(*options));
    return supervisor.run();
  } catch (const hpc::Error& e) {
    std::fprintf(stderr, "hpcrun: error: %s\n", e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hpcrun: error: %s\n", e.what());
    return 1;
  }
}

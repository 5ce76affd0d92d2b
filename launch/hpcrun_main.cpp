// hpcrun: parse the options, run the supervisor, turn errors into one line and an exit code.
// `hpcrun --rank-exec PROGRAM ARGS...` is the per-rank wrapper mpirun starts (rank_report.hpp).
#include <cstdio>
#include <cstring>
#include <exception>

#include "core/error.hpp"
#include "core/log.hpp"
#include "core/standard_streams.hpp"
#include "options.hpp"
#include "rank_report.hpp"
#include "supervisor.hpp"

namespace {

// The rank wrapper's signals wait from the start (rank_report.hpp). (.preinit_array: run before
// every shared library's initialisers.)
void block_early(int argc, char** argv, char**) {
  if (argc > 1 && std::strcmp(argv[1], "--rank-exec") == 0) hpc::launch::block_forwarded_signals();
}
[[gnu::section(".preinit_array"), gnu::used]] void (*const g_block_early)(int, char**, char**) = block_early;

}  // namespace

int main(int argc, char** argv) {
  hpc::hold_closed_standard_streams();  // before any file is opened, as hpctrain's main
  if (argc > 1 && std::strcmp(argv[1], "--rank-exec") == 0) return hpc::launch::rank_exec_main(argc - 2, argv + 2);
  try {
    std::optional<hpc::launch::LaunchOptions> options = hpc::launch::parse_launch_options(argc, argv);
    if (!options) {  // --help or --version printed: in its file, or one line, exit 2
      hpc::log::require_standard_output_written();
      return 0;
    }
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

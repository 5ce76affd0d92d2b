// hpctrain: start MPI, pick the subcommand (train, the default; evaluate; inspect; export;
// predict), run it, turn errors into one line and an exit code (2: the user's input, 1:
// hpctrain's own failure).
#include <sys/resource.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <thread>

#include "core/crash.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/standard_streams.hpp"
#include "dist/agree.hpp"
#include "dist/process.hpp"
#include "train/options/options.hpp"
#include "train/run/boundary.hpp"
#include "train/run/commands.hpp"
#include "train/run/trainer.hpp"
#include "train/serve/serving.hpp"
#include "train/state/snapshots.hpp"
#include "train/stop/signals.hpp"
#include "train/stop/watchdog.hpp"

namespace {

// One line on stderr. An error every rank threw is printed by rank 0 alone, and every rank
// exits with its code; an error one rank met alone names that rank and ends the whole job,
// since the others would wait for it forever.
int fail(hpc::dist::ProcessContext& ctx, bool collective, int code, const char* message) {
  const std::string line = hpc::one_line(message);
  const char* what = line.c_str();
  const bool several = ctx.world_size() > 1;
  if (collective) {
    if (ctx.rank() == 0) std::fprintf(stderr, "%shpctrain: error: %s\n", hpc::log::stamp(stderr).c_str(), what);
    return code;
  }
  const std::string stamp = hpc::log::stamp(stderr);  // with --log-timestamps on
  if (several) std::fprintf(stderr, "%shpctrain: error: %s: %s\n", stamp.c_str(), ctx.where().c_str(), what);
  else std::fprintf(stderr, "%shpctrain: error: %s\n", stamp.c_str(), what);
  std::fflush(stderr);
  if (several) ctx.world().abort(code);
  return code;
}

// A stop signal in the first moments (the shared libraries' initialisers, MPI's start) waits
// for the signal thread instead of killing the process unannounced: blocked before anything
// else runs. (.preinit_array: an executable's own, run before every library's initialisers.)
void block_early(int, char**, char**) { hpc::train::block_stop_signals(); }
[[gnu::section(".preinit_array"), gnu::used]] void (*const g_block_early)(int, char**, char**) = block_early;

// `hpctrain evaluate|inspect|export|predict|clean-snapshots|persist-snapshot ...`; `hpctrain train ...` or options alone train.
const char* command_of(int argc, char** argv) { return argc > 1 && argv[1][0] != '-' ? argv[1] : "train"; }

// The command's exit code; errors become their one line and code here.
int run_command(hpc::dist::ProcessContext& ctx, int argc, char** argv) {
  try {
    const char* command = command_of(argc, argv);
    // A rank given another command would wait in that command's collectives for ever.
    hpc::dist::require_same_text(ctx, command, hpc::ErrorKind::Usage, [&](int r, const std::string& theirs) {
      return hpc::detail::concat("rank ", r, " was started with the command ", theirs, ", rank 0 with ", command);
    });
    // What a command printed is its result (and --help's, --version's): it must be in its file.
    // (A training's progress lines are not: it goes on without them, core/log.cpp.)
    const auto printed = [&](int code) {
      hpc::dist::collectively(ctx, hpc::log::require_standard_output_written);
      return code;
    };
    if (std::strcmp(command, "evaluate") == 0) return printed(hpc::train::run_evaluate(argc - 1, argv + 1, ctx));
    if (std::strcmp(command, "inspect") == 0) return printed(hpc::train::run_inspect(argc - 1, argv + 1, ctx));
    if (std::strcmp(command, "export") == 0) return printed(hpc::train::run_export(argc - 1, argv + 1, ctx));
    if (std::strcmp(command, "predict") == 0) return printed(hpc::train::run_predict(argc - 1, argv + 1, ctx));
    if (std::strcmp(command, "clean-snapshots") == 0)
      return printed(hpc::train::run_clean_snapshots(argc - 1, argv + 1, ctx));
    if (std::strcmp(command, "persist-snapshot") == 0)
      return printed(hpc::train::run_persist_snapshot(argc - 1, argv + 1, ctx));
    hpc::dist::collectively(ctx, [&] { hpc::train::require_known_command(command); });
    if (std::strcmp(command, "train") == 0 && argc > 1 && argv[1][0] != '-') --argc, ++argv;
    std::optional<hpc::train::TrainOptions> options;
    // Every rank parses the same command line, so a bad flag fails on all of them alike.
    hpc::dist::collectively(ctx, [&] { options = hpc::train::parse_options(argc, argv, ctx.rank() == 0); });
    if (!options) return printed(0);  // --help, --version
    hpc::log::set_progress_output();
    return hpc::train::run_training(*options, ctx).exit_code;
  } catch (const hpc::dist::CollectiveError& e) {
    return fail(ctx, true, e.exit_code(), e.what());
  } catch (const hpc::Error& e) {
    return fail(ctx, false, e.exit_code(), e.what());
  } catch (const std::bad_alloc&) {
    return fail(ctx, false, 1, hpc::kOutOfMemory);
  } catch (const std::exception& e) {
    return fail(ctx, false, 1, hpc::what_it_means(e).c_str());
  }
}

// The libraries' exit handlers take milliseconds; one held longer is stuck (train/stop/watchdog.hpp).
constexpr double kExitHandlersSeconds = 10;

// The test hook HPCTRAIN_TEST_LINGER_AFTER_MPI=seconds@rank (whole seconds, the other hooks'
// form): that rank stays this long after MPI's end, as one whose process takes a moment longer to
// end than its peers' (tests/integration/mpi_test.cpp: mpirun's SIGTERM then must end it quietly,
// with its code).
void linger_if_asked(int rank) {
  const hpc::train::TestHook h = hpc::train::TestHook::from_environment("HPCTRAIN_TEST_LINGER_AFTER_MPI", SIGTERM);
  if (h.step > 0 && h.rank == rank) std::this_thread::sleep_for(std::chrono::seconds(h.step));
}

// The test hook HPCTRAIN_TEST_STOP_BEFORE_MPI_END=1@rank: that rank stops (SIGSTOP) right before
// MPI's end, as a peer whose host hangs after its last collective (mpi_test.cpp: the others end
// within their --step-timeout instead of waiting in MPI_Finalize for ever).
void stop_before_mpi_end_if_asked(int rank) {
  const hpc::train::TestHook h = hpc::train::TestHook::from_environment("HPCTRAIN_TEST_STOP_BEFORE_MPI_END", SIGSTOP);
  if (h.step > 0 && h.rank == rank) ::kill(::getpid(), SIGSTOP);
}

// A split of packed shards is read through one descriptor a shard, held for the whole run:
// ImageNet's 1252 + 49 at the default 1024 images each pass the soft limit of 1024 that many
// logins get. The hard limit is the administrator's word; the soft one is raised to it.
void raise_open_file_limit() {
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
  limit.rlim_cur = limit.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &limit);
}

}  // namespace

int main(int argc, char** argv) {
  // Before any file is opened: a closed standard output's number is no file's of this run.
  hpc::hold_closed_standard_streams();
  raise_open_file_limit();
  // A closed standard output (its reader gone: `| head`, a dead tee) fails the write, said once
  // (core/log.cpp), instead of killing a training in the middle of a step or a checkpoint write
  // and leaving its lock and a heartbeat that says "training".
  std::signal(SIGPIPE, SIG_IGN);
  // Before MPI starts its threads: they must block the stop signals. Training takes a stop as a
  // request from here on; the other commands have nothing to save and end at once.
  const char* first = command_of(argc, argv);
  bool trains = true;  // (an unknown command too: training's check names it)
  for (const char* other : hpc::train::kCommandNames)
    trains = trains && (std::strcmp(other, "train") == 0 || std::strcmp(first, other) != 0);
  try {
    hpc::train::start_signal_thread(trains ? hpc::train::OnStopSignal::Request : hpc::train::OnStopSignal::Exit);
  } catch (const std::exception& e) {  // before MPI: one process, one line
    std::fprintf(stderr, "hpctrain: error: %s\n", hpc::one_line(hpc::what_it_means(e)).c_str());
    return 1;
  }
  hpc::dist::ProcessContext ctx(&argc, &argv);
  // After MPI_Init: Open MPI installs its handler (a backtrace) only where none is installed,
  // and this one hands on to it.
  hpc::crash::install_reporter();
  hpc::crash::crash_if_asked();
  const int code = run_command(ctx, argc, argv);
  // Every file is closed and every line written: a signal from here on (mpirun's SIGTERM once a
  // peer has exited with a code other than 0) ends this rank quietly with `code`.
  hpc::train::outcome_is_final(code);
  stop_before_mpi_end_if_asked(ctx.rank());
  ctx.finalize();
  linger_if_asked(ctx.rank());
  hpc::train::bound_the_exit(kExitHandlersSeconds, code);
  return code;
}

// hpctrain: start MPI, pick the subcommand (train, the default; evaluate; inspect), run it,
// turn errors into one line and an exit code (2: the user's input, 1: hpctrain's own failure).
#include <cstdio>
#include <cstring>
#include <exception>

#include "core/error.hpp"
#include "dist/agree.hpp"
#include "dist/process.hpp"
#include "train/commands.hpp"
#include "train/options.hpp"
#include "train/signals.hpp"
#include "train/trainer.hpp"

namespace {

// One line on stderr. An error every rank threw is printed by rank 0 alone, and every rank
// exits with its code; an error one rank met alone names that rank and ends the whole job,
// since the others would wait for it forever.
int fail(hpc::dist::ProcessContext& ctx, bool collective, int code, const char* what) {
  const bool several = ctx.world_size() > 1;
  if (collective) {
    if (ctx.rank() == 0) std::fprintf(stderr, "hpctrain: error: %s\n", what);
    return code;
  }
  if (several) std::fprintf(stderr, "hpctrain: error: %s: %s\n", ctx.where().c_str(), what);
  else std::fprintf(stderr, "hpctrain: error: %s\n", what);
  std::fflush(stderr);
  if (several) ctx.world().abort(code);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  hpc::train::start_signal_thread();  // before MPI starts its threads: they must block the stop signals
  hpc::dist::ProcessContext ctx(&argc, &argv);
  try {
    // `hpctrain evaluate ...`, `hpctrain inspect ...`; `hpctrain train ...` or options alone train.
    const char* command = argc > 1 && argv[1][0] != '-' ? argv[1] : "train";
    if (std::strcmp(command, "evaluate") == 0) return hpc::train::run_evaluate(argc - 1, argv + 1, ctx);
    if (std::strcmp(command, "inspect") == 0) return hpc::train::run_inspect(argc - 1, argv + 1, ctx);
    if (std::strcmp(command, "train") == 0 && argc > 1 && argv[1][0] != '-') --argc, ++argv;
    std::optional<hpc::train::TrainOptions> options;
    // Every rank parses the same command line, so a bad flag fails on all of them alike.
    hpc::dist::collectively(ctx, [&] { options = hpc::train::parse_options(argc, argv, ctx.rank() == 0); });
    if (!options) return 0;
    return hpc::train::run_training(*options, ctx).exit_code;
  } catch (const hpc::dist::CollectiveError& e) {
    return fail(ctx, true, e.exit_code(), e.what());
  } catch (const hpc::Error& e) {
    return fail(ctx, false, e.exit_code(), e.what());
  } catch (const std::exception& e) {
    return fail(ctx, false, 1, e.what());
  }
}

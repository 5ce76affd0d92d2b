// hpctrain: parse the options, run the job, turn errors into one line and an exit code.
#include <cstdio>
#include <exception>

#include "core/error.hpp"
#include "train/options.hpp"
#include "train/trainer.hpp"

int main(int argc, char** argv) {
  try {
    auto options = hpc::train::parse_options(argc, argv);
    if (!options) return 0;
    hpc::train::run_training(*options);
    return 0;
  } catch (const hpc::Error& e) {
    std::fprintf(stderr, "hpctrain: error: %s\n", e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hpctrain: error: %s\n", e.what());
    return 1;
  }
}

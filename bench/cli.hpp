// The command lines of the bench programs written in C++, read as gemm_shapes and gpu_step read
// theirs (Boost.Program_options): --help prints the options, and anything they cannot take (an
// unknown option, a missing or malformed value, a value out of range) is one line naming it and
// exit code 2; the program's own failures are one line and hpc::Error's exit code (run_main).
#pragma once

#include <boost/program_options.hpp>

#include <cstdio>
#include <exception>
#include <functional>
#include <iostream>
#include <optional>
#include <string>

#include "core/error.hpp"
#include "core/option_kit.hpp"

namespace hpc::bench {

namespace po = boost::program_options;

// Reads argv into the values desc names (desc gets --help). check may throw po::error for a
// value out of range, or hpc::Error from the suite's own parse of a value (its exit code). Returns the exit code to end with (0 after --help, 2 after a usage error),
// or nothing: go on.
inline std::optional<int> read_command_line(const char* program, int argc, char** argv,
                                            po::options_description& desc, const std::function<void()>& check = {}) {
  desc.add_options()("help,h", "print this help and exit");
  const po::positional_options_description none;  // a word that is no option's value is refused
  try {
    po::variables_map vm;
    po::store(po::command_line_parser(argc, argv).options(desc).positional(none).run(), vm);
    po::notify(vm);
    if (vm.count("help")) {
      std::cout << desc << "\n";
      return 0;
    }
    if (check) check();
  } catch (const po::error& e) {
    std::fprintf(stderr, "%s: error: %s (try --help)\n", program,
                 options::error_text(e, argc, argv, desc, none).c_str());
    return 2;
  } catch (const Error& e) {  // check's parse of a value through the suite's own readers (a model's name)
    std::fprintf(stderr, "%s: error: %s (try --help)\n", program, e.what());
    return e.exit_code();
  }
  return std::nullopt;
}

// body's exit code; an exception it throws is one line (hpc::Error: its exit code, else 1).
inline int run_main(const char* program, const std::function<int()>& body) {
  try {
    return body();
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, e.what());
    return 1;
  }
}

// A po::error naming the option when `ok` is false.
inline void require(bool ok, const std::string& what) {
  if (!ok) throw po::error(what);
}

}  // namespace hpc::bench

// What every fuzz target asks of hpctrain's readers beyond the sanitizers' checks: whatever the
// bytes, reading them returns or ends in a usage error (hpc::Error of kind Usage, exit code 2),
// one printable line that names the problem. Any other way out is a finding, and ends the
// process with the reason (libFuzzer then saves the input):
//   - an internal error (HPC_CHECK): bad input reached an invariant meant for hpctrain's own bugs;
//   - any other exception (std::out_of_range from a substr, std::invalid_argument from a stoi,
//     std::bad_alloc from a size read out of the file): the user would get no clear line;
//   - a usage error whose message is empty.
// The targets (tests/fuzz/*_fuzz.cpp) are built two ways (tests/CMakeLists.txt): with the driver
// (driver.cpp), which reads each file of their corpus (tests/fuzz/corpus/TARGET/) once, as a CTest
// test in every build; and, with -DHPCTRAIN_FUZZ=ON under Clang, with libFuzzer, to search.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <system_error>
#include <typeinfo>

#include "core/error.hpp"
#include "temp_dir.hpp"

namespace hpc::fuzz {

// The scratch directory once made (Scratch below): abort() runs no destructor, so a finding
// removes it itself. (A sanitizer's report still ends the process without it: libFuzzer's own
// death callback, which saves the input, is the only one there may be.)
inline std::filesystem::path g_scratch_dir;

[[noreturn]] inline void finding(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz contract broken: %s: %s\n", what, detail.c_str());
  std::fflush(stderr);
  if (!g_scratch_dir.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(g_scratch_dir, ignored);
  }
  std::abort();
}

// Runs f; returns whether it returned (false: a usage error, as bad input should end).
template <class F>
bool usage_error_or_success(F&& f) {
  try {
    f();
    return true;
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::Usage) finding("an internal error from bad input", e.what());
    if (std::string(e.what()).empty()) finding("a usage error without a message", "");
    return false;
  } catch (const std::exception& e) {
    finding(typeid(e).name(), e.what());
  } catch (...) {
    finding("an exception of unknown type", "");
  }
}

// A directory for the files a target hands to readers that take paths, made once per process
// (the tests' TempDir: TMPDIR/hpctrain-fuzz-XXXXXX) and removed at its end.
class Scratch {
 public:
  static const Scratch& get() {
    static const Scratch s;
    return s;
  }
  std::string dir() const { return dir_.str(); }
  // Writes bytes to DIR/name (replacing it); returns the path.
  std::string write(const std::string& name, std::span<const uint8_t> bytes) const {
    const std::string path = dir_.file(name);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    if (!out.flush()) finding("the fuzz target's own scratch file", path);
    return path;
  }

 private:
  Scratch() { g_scratch_dir = dir_.path(); }
  testing::TempDir dir_{"fuzz"};
};

}  // namespace hpc::fuzz

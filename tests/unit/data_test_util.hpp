// Helpers shared by the data tests: a temporary directory, raw file writes, usage errors.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "temp_dir.hpp"

namespace hpc::data {

using Bytes = std::vector<uint8_t>;

using hpc::testing::TempDir;  // (temp_dir.hpp)

inline void write_raw(const std::string& path, const Bytes& b) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline Bytes read_raw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

// The message of the usage error f throws ("" and a test failure if it throws something else).
inline std::string usage_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no hpc::Error thrown";
  return "";
}

}  // namespace hpc::data

// main() of the unit tests: one math-library thread per test process, so that `ctest -j N`
// runs N processes on N cores instead of N x cores threads fighting over them.
#include <gtest/gtest.h>

#include "nn/gemm.hpp"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  hpc::nn::set_math_threads(1);
  return RUN_ALL_TESTS();
}

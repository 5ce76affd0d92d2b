// Row-major matrix products for the CPU layers: C = alpha * op(A) * op(B) + beta * C, with
// op(A) M x K and op(B) K x N. The float version is served by the backend CMake picked
// (gemm_dnnl.cpp or gemm_openblas.cpp; bench/gemm_shapes measures both); double always goes
// to OpenBLAS, it serves the gradient checks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

namespace hpc::nn {

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
          int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc);

// A layer's bias around its product: every row of y (rows x width) set to the bias, for a gemm
// with beta 1 to add to; and the bias's gradient, the sums of dy's columns, taken row after row
// in one order everywhere (the bits of a layer's gradient do not depend on which path made it).
template <class T>
void bias_rows(T* y, int64_t rows, int64_t width, const T* bias) {
  for (int64_t r = 0; r < rows; ++r) std::memcpy(y + r * width, bias, sizeof(T) * width);
}
template <class T>
void bias_gradient(const T* dy, int64_t rows, int64_t width, T* db) {
  std::fill(db, db + width, T(0));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < width; ++c) db[c] += dy[r * width + c];
}

// The float backend's name, for logs and benchmarks.
const char* gemm_backend();
// What the float backend computes with on this machine, as far as it sets the bits beyond this
// binary's own code: its library, version and the kernels it chose at run time by the CPU
// ("oneDNN 2.6.3 avx512_core", "OpenBLAS 0.3.21 SkylakeX").
std::string gemm_kernels();
// Everything of that kind the CPU layers use (the GEMM's and the library convolution's, each
// once, joined by ", "): two machines that give the same compute the same bits with this binary.
std::string cpu_kernels();
// Threads the math libraries may use in this process.
void set_math_threads(int threads);

}  // namespace hpc::nn

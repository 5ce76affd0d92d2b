// Row-major matrix products for the CPU layers: C = alpha * op(A) * op(B) + beta * C, with
// op(A) M x K and op(B) K x N. The float version is served by the backend CMake picked
// (gemm_dnnl.cpp or gemm_openblas.cpp; bench/gemm_shapes measures both); double always goes
// to OpenBLAS, it serves the gradient checks.
#pragma once

#include <cstdint>

namespace hpc::nn {

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
          int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc);

// The float backend's name, for logs and benchmarks.
const char* gemm_backend();
// Threads the math libraries may use in this process.
void set_math_threads(int threads);

}  // namespace hpc::nn

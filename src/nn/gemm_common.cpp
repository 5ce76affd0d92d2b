// The double GEMM and the thread setting, shared by both float backends.
#include <cblas.h>
#include <omp.h>

#include "nn/cblas_gemm.hpp"
#include "nn/gemm.hpp"

namespace hpc::nn {

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
          int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  row_major_gemm(cblas_dgemm, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void set_math_threads(int threads) {
  openblas_set_num_threads(threads);
  omp_set_num_threads(threads);  // oneDNN and our own loops run on OpenMP
}

}  // namespace hpc::nn

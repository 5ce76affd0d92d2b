// The double GEMM and the thread setting, shared by both float backends.
#include <cblas.h>
#include <omp.h>

#include "nn/gemm.hpp"

namespace hpc::nn {

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
          int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda),
              b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

void set_math_threads(int threads) {
  openblas_set_num_threads(threads);
  omp_set_num_threads(threads);  // oneDNN and our own loops run on OpenMP
}

}  // namespace hpc::nn

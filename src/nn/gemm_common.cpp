// The double GEMM, the thread setting and what the CPU layers compute with, shared by both float
// backends.
#include <cblas.h>
#include <omp.h>

#include "nn/cblas_gemm.hpp"
#include "nn/gemm.hpp"
#include "nn/library_conv.hpp"

namespace hpc::nn {

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
          int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  row_major_gemm(cblas_dgemm, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

std::string cpu_kernels() {
  std::string kernels = gemm_kernels();
  const std::string conv = library_conv_kernels();
  if (!conv.empty() && conv != kernels) kernels += ", " + conv;
  return kernels;
}

void set_math_threads(int threads) {
  openblas_set_num_threads(threads);
  omp_set_num_threads(threads);  // oneDNN and our own loops run on OpenMP
}

}  // namespace hpc::nn

#include <cblas.h>

#include <string>

#include "nn/cblas_gemm.hpp"
#include "nn/gemm.hpp"

namespace hpc::nn {

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  row_major_gemm(cblas_sgemm, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

const char* gemm_backend() { return "openblas"; }

// openblas_get_config() begins "OpenBLAS 0.3.21 DYNAMIC_ARCH ...": its first two words.
std::string gemm_kernels() {
  std::string config = openblas_get_config();
  const size_t version_end = config.find(' ', config.find(' ') + 1);
  if (version_end != std::string::npos) config.resize(version_end);
  return config + " " + openblas_get_corename();
}

}  // namespace hpc::nn

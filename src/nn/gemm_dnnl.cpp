#include <dnnl.h>

#include "core/error.hpp"
#include "nn/gemm.hpp"

namespace hpc::nn {

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb,
                                beta, c, ldc);
  HPC_CHECK(st == dnnl_success, "dnnl_sgemm failed with status ", static_cast<int>(st), " (m=", m,
            " n=", n, " k=", k, ")");
}

const char* gemm_backend() { return "onednn"; }

}  // namespace hpc::nn

// A row-major gemm (nn/gemm.hpp's arguments) as a CBLAS call, cblas_sgemm or cblas_dgemm: the
// transposes and the sizes as CBLAS takes them. For the backends that go to OpenBLAS (the double
// gemm always, the float one with HPCTRAIN_CPU_GEMM=openblas).
#pragma once

#include <cblas.h>

#include <cstdint>

namespace hpc::nn {

template <class T, class CblasGemm>
void row_major_gemm(CblasGemm call, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                    int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  call(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(m),
       static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta, c,
       static_cast<int>(ldc));
}

}  // namespace hpc::nn

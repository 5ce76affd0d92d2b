// The check macros of the GPU libraries (DESIGN.md principle 4): every CUDA runtime and
// cuBLAS call, and every kernel launch, is checked; a failure throws hpc::Error naming the
// call, the file and line and the library's own error string. cuDNN and NCCL calls use
// HPC_GPU_CHECK with their own error-string functions (src/nn, src/dist), so this header needs
// only the CUDA toolkit. Included only by files CMake compiles when CUDA is present.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "core/error.hpp"

namespace hpc::detail {
[[noreturn]] void throw_gpu_error(const char* library, const char* call, const char* file, int line,
                                  const char* what);
const char* cublas_error_string(cublasStatus_t s);
}  // namespace hpc::detail

// ok: the library's success value; what(r): its message for result r.
#define HPC_GPU_CHECK(library, expr, ok, what)                                                    \
  do {                                                                                            \
    const auto hpc_gpu_result_ = (expr);                                                          \
    if (hpc_gpu_result_ != (ok))                                                                  \
      ::hpc::detail::throw_gpu_error(library, #expr, __FILE__, __LINE__, what(hpc_gpu_result_)); \
  } while (0)

#define CUDA_CHECK(expr) HPC_GPU_CHECK("CUDA", expr, cudaSuccess, cudaGetErrorString)
#define CUBLAS_CHECK(expr) HPC_GPU_CHECK("cuBLAS", expr, CUBLAS_STATUS_SUCCESS, ::hpc::detail::cublas_error_string)
// After every kernel launch: launch errors (bad configuration) show here; faults inside the
// kernel show at the next synchronising call, which is checked too.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

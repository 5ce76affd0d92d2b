// cuBLAS, loaded when the GPU path first needs it (dlopen), not when a program starts: linking
// libcublas.so runs libcublasLt's static initialisers in every process, 0.34 s before main() on
// a 2-core VM even for `hpctrain --version`, for every rank, relaunch and CPU-only run of the
// CUDA build. The entry points keep cuBLAS's own types (cublas_v2.h, from the toolkit the build
// found), so a call through them is checked by the compiler as a linked call would be.
// Compiled only when CMake found the CUDA toolkit.
#pragma once

#include <cublas_v2.h>

#include <memory>
#include <string>

#include "core/shared_library.hpp"

namespace hpc::cublas {

// cublasGemmEx as libcublas exports it (compute type cublasComputeType_t); cublas_api.h adds an
// inline C++ overload that takes cudaDataType, so decltype cannot name it alone. The
// static_assert (unevaluated: nothing is linked) checks that the exported one has this type.
using GemmExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                    const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                                    cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
static_assert(sizeof(static_cast<GemmExFn>(&::cublasGemmEx)) == sizeof(void*));

// The entry points hpctrain calls, named as cuBLAS names them without its prefix (cublas_v2.h
// maps several to their _v2 symbols, which is what `load` resolves).
struct Api {
  decltype(&::cublasCreate) Create = nullptr;
  decltype(&::cublasDestroy) Destroy = nullptr;
  decltype(&::cublasSetStream) SetStream = nullptr;
  decltype(&::cublasSetWorkspace) SetWorkspace = nullptr;
  decltype(&::cublasSetMathMode) SetMathMode = nullptr;
  decltype(&::cublasGetStatusString) GetStatusString = nullptr;
  decltype(&::cublasSgemm) Sgemm = nullptr;
  decltype(&::cublasSgemv) Sgemv = nullptr;
  decltype(&::cublasSger) Sger = nullptr;
  GemmExFn GemmEx = nullptr;
};

// The library and its entry points.
struct Library {
  std::unique_ptr<SharedLibrary> dl;
  Api api;
};

// The soname of the cuBLAS this was built against (libcublas.so.13 for CUDA 13), and the
// toolkit's library folder, where `api` looks when the loader does not find it.
extern const char* const kSoname;
extern const char* const kToolkitLibraryDir;

// Opens `name` and resolves every entry point; null, with *why naming what failed, when it
// cannot.
std::unique_ptr<Library> load(const std::string& name, std::string* why);

// kSoname as the loader finds it, else from kToolkitLibraryDir; *why: the first reason.
std::unique_ptr<Library> load_installed(std::string* why);

// The process's cuBLAS, loaded on the first call (load_installed) and kept to the end of the process (cuBLAS handles may outlive any scope
// here). Throws a usage error naming the library and the reason when it cannot be loaded.
const Api& api();

}  // namespace hpc::cublas

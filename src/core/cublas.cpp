#include "core/cublas.hpp"

#include <atomic>

#include "core/cuda_check.hpp"
#include "core/error.hpp"

#ifndef HPCTRAIN_CUBLAS_SONAME
#error "CMake sets HPCTRAIN_CUBLAS_SONAME and HPCTRAIN_CUDA_LIBRARY_DIR for this file"
#endif

namespace hpc::cublas {

const char* const kSoname = HPCTRAIN_CUBLAS_SONAME;
const char* const kToolkitLibraryDir = HPCTRAIN_CUDA_LIBRARY_DIR;

// "cublasCreate_v2" for cublasCreate: the argument is macro-expanded before # applies.
#define HPC_CUBLAS_SYMBOL_(name) #name
#define HPC_CUBLAS_SYMBOL(name) HPC_CUBLAS_SYMBOL_(name)
#define HPC_CUBLAS_RESOLVE(member) \
  dl.resolve(HPC_CUBLAS_SYMBOL(cublas##member), "cuBLAS", &lib->api.member, why)

namespace {

std::atomic<const Api*> loaded{nullptr};  // api()'s entry points, once loaded: for cublas_error_string

}  // namespace

std::unique_ptr<Library> load(const std::string& name, std::string* why) {
  auto lib = std::make_unique<Library>();
  lib->dl = SharedLibrary::open(name, why);
  if (!lib->dl) return nullptr;
  const SharedLibrary& dl = *lib->dl;
  const bool ok = HPC_CUBLAS_RESOLVE(Create) && HPC_CUBLAS_RESOLVE(Destroy) && HPC_CUBLAS_RESOLVE(SetStream) &&
                  HPC_CUBLAS_RESOLVE(SetWorkspace) && HPC_CUBLAS_RESOLVE(SetMathMode) &&
                  HPC_CUBLAS_RESOLVE(GetStatusString) && HPC_CUBLAS_RESOLVE(Sgemm) && HPC_CUBLAS_RESOLVE(Sgemv) &&
                  HPC_CUBLAS_RESOLVE(Sger) && HPC_CUBLAS_RESOLVE(GemmEx);
  if (!ok) return nullptr;
  return lib;
}

std::unique_ptr<Library> load_installed(std::string* why) {
  std::unique_ptr<Library> lib = load(kSoname, why);
  if (!lib) lib = load(detail::concat(kToolkitLibraryDir, "/", kSoname), nullptr);
  return lib;
}

const Api& api() {
  // Loaded once (a failure throws, and the next call tries again); never unloaded: handles
  // destroyed at exit still call into it.
  static const Library* const library = [] {
    std::string why;
    std::unique_ptr<Library> lib = load_installed(&why);
    if (!lib)
      throw Error(ErrorKind::Usage, detail::concat("the GPU path needs cuBLAS: ", why,
                                                   "; install NVIDIA's cuBLAS of this CUDA (", kSoname,
                                                   ") or use --device cpu"));
    return lib.release();
  }();
  loaded.store(&library->api, std::memory_order_release);
  return library->api;
}

}  // namespace hpc::cublas

namespace hpc::detail {

// CUBLAS_CHECK's words for a status: the loaded cuBLAS's (a status comes only from a call into it).
const char* cublas_error_string(cublasStatus_t status) {
  const cublas::Api* a = cublas::loaded.load(std::memory_order_acquire);
  if (a) return a->GetStatusString(status);
  static thread_local std::string text;
  text = concat("cuBLAS status ", static_cast<int>(status));
  return text.c_str();
}

}  // namespace hpc::detail

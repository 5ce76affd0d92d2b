// cuBLAS is loaded at run time (core/cublas.hpp). These run wherever the CUDA toolkit is
// installed, with or without a GPU: loading and resolving need no device.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>

#include "core/cublas.hpp"
#include "core/cuda_check.hpp"

namespace hpc::cublas {
namespace {

// Every entry point is the symbol cublas_v2.h's macros name: cublasSgemm is cublasSgemm_v2
// there, and libcublas also exports the legacy cublasSgemm of cublas.h, with another signature.
// A call through the wrong one would pass the compiler and crash on the GPU.
TEST(CublasLoad, EveryEntryPointIsTheSymbolTheV2HeaderNames) {
  std::string why;
  std::unique_ptr<Library> lib = load_installed(&why);
  ASSERT_NE(lib, nullptr) << why;
  void* dl = dlopen(lib->dl->name().c_str(), RTLD_NOW | RTLD_LOCAL);  // the same file, opened again
  ASSERT_NE(dl, nullptr) << dlerror();
  const auto expect = [&](const void* entry, const char* symbol) {
    EXPECT_EQ(entry, dlsym(dl, symbol)) << symbol;
  };
  const Api& a = lib->api;
  expect(reinterpret_cast<const void*>(a.Create), "cublasCreate_v2");
  expect(reinterpret_cast<const void*>(a.Destroy), "cublasDestroy_v2");
  expect(reinterpret_cast<const void*>(a.SetStream), "cublasSetStream_v2");
  expect(reinterpret_cast<const void*>(a.SetWorkspace), "cublasSetWorkspace_v2");
  expect(reinterpret_cast<const void*>(a.SetMathMode), "cublasSetMathMode");
  expect(reinterpret_cast<const void*>(a.GetStatusString), "cublasGetStatusString");
  expect(reinterpret_cast<const void*>(a.Sgemm), "cublasSgemm_v2");
  expect(reinterpret_cast<const void*>(a.Sgemv), "cublasSgemv_v2");
  expect(reinterpret_cast<const void*>(a.Sger), "cublasSger_v2");
  expect(reinterpret_cast<const void*>(a.GemmEx), "cublasGemmEx");
  dlclose(dl);
}

TEST(CublasLoad, AnAbsentLibraryIsNamedWithTheLoadersReason) {
  std::string why;
  EXPECT_EQ(load("libcublas-not-here.so.13", &why), nullptr);
  EXPECT_NE(why.find("cannot load libcublas-not-here.so.13"), std::string::npos) << why;
  EXPECT_NE(why.find("No such file"), std::string::npos) << why;  // dlerror's words
}

TEST(CublasLoad, ALibraryWithoutItsEntryPointsIsRefused) {
  std::string why;
  EXPECT_EQ(load("libz.so.1", &why), nullptr);  // loads, but is not cuBLAS
  EXPECT_NE(why.find("libz.so.1 has no cublasCreate_v2"), std::string::npos) << why;
  EXPECT_NE(why.find("not cuBLAS"), std::string::npos) << why;
}

// CUBLAS_CHECK's words: a number until cuBLAS is loaded (no status can come before), then the
// library's own.
TEST(CublasLoad, StatusWordsComeFromTheLoadedLibrary) {
  EXPECT_STREQ(detail::cublas_error_string(CUBLAS_STATUS_INVALID_VALUE), "cuBLAS status 7");
  const Api& a = api();
  EXPECT_STREQ(detail::cublas_error_string(CUBLAS_STATUS_INVALID_VALUE),
               a.GetStatusString(CUBLAS_STATUS_INVALID_VALUE));
  EXPECT_STRNE(detail::cublas_error_string(CUBLAS_STATUS_INVALID_VALUE), "cuBLAS status 7");
}

// The point of loading it late: no program of the CUDA build loads libcublas (or libcublasLt,
// 0.34 s of static initialisers) when it starts, directly or through another library.
TEST(CublasLoad, TheProgramsDoNotLoadCublasWhenTheyStart) {
  for (const char* program : {HPCTRAIN_BIN, HPCRUN_BIN}) {
    const std::string command = std::string("ldd ") + program + " 2>&1";
    FILE* p = popen(command.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    ASSERT_EQ(pclose(p), 0) << command << ":\n" << out;
    if (std::string(program) == HPCTRAIN_BIN) {
      EXPECT_NE(out.find("libcudart"), std::string::npos) << "not the CUDA build:\n" << out;
    }
    EXPECT_EQ(out.find("libcublas"), std::string::npos) << program << " loads cuBLAS at start:\n" << out;
  }
}

}  // namespace
}  // namespace hpc::cublas

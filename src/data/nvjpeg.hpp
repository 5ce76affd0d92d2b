// NVIDIA's nvJPEG, loaded at run time (dlopen): the GPU machines have CUDA 13's libnvjpeg.so.13,
// but the build machines' CUDA toolkit has no nvJPEG and Debian no package of it. So we declare
// ourselves the few calls we make, from NVIDIA's nvjpeg.h (its C API, stable since CUDA 11: C
// enums passed as int, opaque handles), and a build without the library still compiles, runs
// and says why the CPU decodes. Nothing here needs CUDA's headers: cudaStream_t is CUDA's own
// `struct CUstream_st*`, declared the same way.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "core/shared_library.hpp"

struct CUstream_st;  // cudaStream_t is `struct CUstream_st*` (driver_types.h)

namespace hpc::data {

namespace nvjpeg {

// nvjpegStatus_t
enum Status : int {
  kSuccess = 0,
  kNotInitialized = 1,
  kInvalidParameter = 2,
  kBadJpeg = 3,
  kJpegNotSupported = 4,
  kAllocatorFailure = 5,
  kExecutionFailed = 6,
  kArchMismatch = 7,
  kInternalError = 8,
  kImplementationNotSupported = 9,
  kIncompleteBitstream = 10,
};
// nvjpegBackend_t: the hardware decoder (A100, H100, H200) or the library's choice among the
// CUDA ones (hybrid: Huffman on the CPU or the GPU).
enum Backend : int { kBackendDefault = 0, kBackendHardware = 3 };
// nvjpegOutputFormat_t: interleaved RGB into channel[0], as libjpeg-turbo's TJPF_RGB.
enum OutputFormat : int { kOutputRgbi = 5 };
constexpr int kMaxComponent = 4;  // NVJPEG_MAX_COMPONENT

// nvjpegImage_t
struct Image {
  unsigned char* channel[kMaxComponent];
  size_t pitch[kMaxComponent];
};

struct HandleOpaque;
using Handle = HandleOpaque*;  // nvjpegHandle_t
struct StateOpaque;
using State = StateOpaque*;  // nvjpegJpegState_t
using Stream = CUstream_st*;  // cudaStream_t

// nvjpegCreateEx(backend, dev_allocator, pinned_allocator, flags, handle): null allocators are
// cudaMalloc and cudaHostAlloc; flags 0.
using CreateEx = int (*)(int backend, void* dev_allocator, void* pinned_allocator, unsigned flags, Handle* handle);
using Destroy = int (*)(Handle handle);
using JpegStateCreate = int (*)(Handle handle, State* state);
using JpegStateDestroy = int (*)(State state);
// nComponents, subsampling (nvjpegChromaSubsampling_t), widths[4], heights[4]
using GetImageInfo = int (*)(Handle handle, const unsigned char* data, size_t length, int* components,
                             int* subsampling, int* widths, int* heights);
using DecodeBatchedInitialize = int (*)(Handle handle, State state, int batch_size, int max_cpu_threads,
                                        int output_format);
using DecodeBatched = int (*)(Handle handle, State state, const unsigned char* const* data, const size_t* lengths,
                              Image* destinations, Stream stream);

// "NVJPEG_STATUS_BAD_JPEG (3)", for error lines.
std::string status_name(int status);

}  // namespace nvjpeg

// The library as NVIDIA ships it with CUDA 13 (package libnvjpeg-13-0).
inline constexpr const char* kNvjpegLibrary = "libnvjpeg.so.13";

// The loaded library and the entry points we call; unloaded when destroyed.
class NvjpegLibrary {
 public:
  // Loads `name` (as dlopen finds it: the loader's path, LD_LIBRARY_PATH) and resolves each
  // entry point; null, with *why saying which part failed (dlerror's words), when it cannot.
  static std::unique_ptr<NvjpegLibrary> load(const std::string& name, std::string* why);
  // kNvjpegLibrary as dlopen finds it, else from the CUDA toolkit's own folder
  // (/usr/local/cuda/lib64, which not every installation gives the loader); *why: the first reason.
  static std::unique_ptr<NvjpegLibrary> load_installed(std::string* why);
  ~NvjpegLibrary();
  NvjpegLibrary(const NvjpegLibrary&) = delete;
  NvjpegLibrary& operator=(const NvjpegLibrary&) = delete;

  nvjpeg::CreateEx create_ex = nullptr;
  nvjpeg::Destroy destroy = nullptr;
  nvjpeg::JpegStateCreate state_create = nullptr;
  nvjpeg::JpegStateDestroy state_destroy = nullptr;
  nvjpeg::GetImageInfo image_info = nullptr;
  nvjpeg::DecodeBatchedInitialize batched_initialize = nullptr;
  nvjpeg::DecodeBatched decode_batched = nullptr;

 private:
  NvjpegLibrary() = default;
  std::unique_ptr<SharedLibrary> dl_;
};

}  // namespace hpc::data

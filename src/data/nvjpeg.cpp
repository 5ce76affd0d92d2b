#include "data/nvjpeg.hpp"

#include "core/error.hpp"

namespace hpc::data {

namespace nvjpeg {

std::string status_name(int status) {
  static const char* const kNames[] = {"SUCCESS",          "NOT_INITIALIZED", "INVALID_PARAMETER",
                                       "BAD_JPEG",         "JPEG_NOT_SUPPORTED", "ALLOCATOR_FAILURE",
                                       "EXECUTION_FAILED", "ARCH_MISMATCH",   "INTERNAL_ERROR",
                                       "IMPLEMENTATION_NOT_SUPPORTED", "INCOMPLETE_BITSTREAM"};
  const bool known = status >= 0 && status < static_cast<int>(std::size(kNames));
  return detail::concat("NVJPEG_STATUS_", known ? kNames[status] : "UNKNOWN", " (", status, ")");
}

}  // namespace nvjpeg

std::unique_ptr<NvjpegLibrary> NvjpegLibrary::load(const std::string& name, std::string* why) {
  std::unique_ptr<NvjpegLibrary> lib(new NvjpegLibrary);
  lib->dl_ = SharedLibrary::open(name, why);
  if (!lib->dl_) return nullptr;
  const SharedLibrary& dl = *lib->dl_;
  const bool ok = dl.resolve("nvjpegCreateEx", "nvJPEG", &lib->create_ex, why) &&
                  dl.resolve("nvjpegDestroy", "nvJPEG", &lib->destroy, why) &&
                  dl.resolve("nvjpegJpegStateCreate", "nvJPEG", &lib->state_create, why) &&
                  dl.resolve("nvjpegJpegStateDestroy", "nvJPEG", &lib->state_destroy, why) &&
                  dl.resolve("nvjpegGetImageInfo", "nvJPEG", &lib->image_info, why) &&
                  dl.resolve("nvjpegDecodeBatchedInitialize", "nvJPEG", &lib->batched_initialize, why) &&
                  dl.resolve("nvjpegDecodeBatched", "nvJPEG", &lib->decode_batched, why);
  if (!ok) return nullptr;
  return lib;
}

std::unique_ptr<NvjpegLibrary> NvjpegLibrary::load_installed(std::string* why) {
  std::unique_ptr<NvjpegLibrary> lib = load(kNvjpegLibrary, why);
  if (!lib) lib = load(std::string("/usr/local/cuda/lib64/") + kNvjpegLibrary, nullptr);
  return lib;
}

NvjpegLibrary::~NvjpegLibrary() = default;

}  // namespace hpc::data

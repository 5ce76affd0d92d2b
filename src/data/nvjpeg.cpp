#include "data/nvjpeg.hpp"

#include <dlfcn.h>

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

namespace {

// dlerror()'s text, which names the file or symbol and why (never null after a failure).
std::string dl_error() {
  const char* e = dlerror();
  return e ? e : "unknown dlopen error";
}

// One entry point into *fn; false (and *why) when the library lacks it.
template <class Fn>
bool resolve(void* dl, const char* symbol, const std::string& name, Fn* fn, std::string* why) {
  dlerror();  // clears an earlier error: a null symbol is only an error when dlerror says so
  *fn = reinterpret_cast<Fn>(dlsym(dl, symbol));
  if (*fn) return true;
  if (why) *why = detail::concat(name, " has no ", symbol, " (", dl_error(), "): not nvJPEG, or too old a one");
  return false;
}

}  // namespace

std::unique_ptr<NvjpegLibrary> NvjpegLibrary::load(const std::string& name, std::string* why) {
  // RTLD_LOCAL: its symbols stay out of the global namespace (no clash with another nvJPEG
  // that a linked library might bring).
  void* dl = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!dl) {
    if (why) *why = detail::concat("cannot load ", name, " (", dl_error(), ")");
    return nullptr;
  }
  std::unique_ptr<NvjpegLibrary> lib(new NvjpegLibrary);
  lib->dl_ = dl;  // dlclose'd by the destructor, on failure below too
  const bool ok = resolve(dl, "nvjpegCreateEx", name, &lib->create_ex, why) &&
                  resolve(dl, "nvjpegDestroy", name, &lib->destroy, why) &&
                  resolve(dl, "nvjpegJpegStateCreate", name, &lib->state_create, why) &&
                  resolve(dl, "nvjpegJpegStateDestroy", name, &lib->state_destroy, why) &&
                  resolve(dl, "nvjpegGetImageInfo", name, &lib->image_info, why) &&
                  resolve(dl, "nvjpegDecodeBatchedInitialize", name, &lib->batched_initialize, why) &&
                  resolve(dl, "nvjpegDecodeBatched", name, &lib->decode_batched, why);
  if (!ok) return nullptr;
  return lib;
}

std::unique_ptr<NvjpegLibrary> NvjpegLibrary::load_installed(std::string* why) {
  std::unique_ptr<NvjpegLibrary> lib = load(kNvjpegLibrary, why);
  if (!lib) lib = load(std::string("/usr/local/cuda/lib64/") + kNvjpegLibrary, nullptr);
  return lib;
}

NvjpegLibrary::~NvjpegLibrary() {
  if (dl_) dlclose(dl_);
}

}  // namespace hpc::data

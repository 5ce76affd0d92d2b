#include "core/shared_library.hpp"

#include <dlfcn.h>

#include "core/error.hpp"

namespace hpc {
namespace {

// dlerror()'s text, which names the file or symbol and why (never null after a failure).
std::string dl_error() {
  const char* e = dlerror();
  return e ? e : "unknown dlopen error";
}

}  // namespace

std::unique_ptr<SharedLibrary> SharedLibrary::open(const std::string& name, std::string* why) {
  void* dl = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!dl) {
    if (why) *why = detail::concat("cannot load ", name, " (", dl_error(), ")");
    return nullptr;
  }
  return std::unique_ptr<SharedLibrary>(new SharedLibrary(dl, name));
}

SharedLibrary::~SharedLibrary() { dlclose(dl_); }

void* SharedLibrary::find(const char* symbol, const char* what, std::string* why) const {
  dlerror();  // clears an earlier error: a null symbol is only an error when dlerror says so
  void* address = dlsym(dl_, symbol);
  if (!address && why)
    *why = detail::concat(name_, " has no ", symbol, " (", dl_error(), "): not ", what, ", or too old a one");
  return address;
}

}  // namespace hpc

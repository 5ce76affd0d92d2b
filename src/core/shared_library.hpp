// A shared library opened at run time (dlopen) and the entry points resolved from it: the GPU
// libraries that are loaded only when used (nvJPEG, which the build machines lack; cuBLAS, whose
// static initialisers cost a third of a second in every process that links it).
#pragma once

#include <memory>
#include <string>
#include <utility>

namespace hpc {

class SharedLibrary {
 public:
  // Opens `name` (a soname the loader searches for: LD_LIBRARY_PATH, the caller's RUNPATH, the
  // loader's cache; or a path) with RTLD_NOW | RTLD_LOCAL, so its symbols stay out of the global
  // namespace. Null, with *why ("cannot load NAME (dlerror's words)"), when it cannot.
  static std::unique_ptr<SharedLibrary> open(const std::string& name, std::string* why);
  ~SharedLibrary();  // dlclose
  SharedLibrary(const SharedLibrary&) = delete;
  SharedLibrary& operator=(const SharedLibrary&) = delete;

  // Sets *fn to `symbol`'s address; false, with *why ("NAME has no SYMBOL (...): not WHAT, or
  // too old a one"), when the library lacks it.
  template <class Fn>
  bool resolve(const char* symbol, const char* what, Fn* fn, std::string* why) const {
    void* address = find(symbol, what, why);
    *fn = reinterpret_cast<Fn>(address);
    return address != nullptr;
  }

  const std::string& name() const { return name_; }

 private:
  SharedLibrary(void* dl, std::string name) : dl_(dl), name_(std::move(name)) {}
  void* find(const char* symbol, const char* what, std::string* why) const;

  void* dl_;
  std::string name_;
};

}  // namespace hpc

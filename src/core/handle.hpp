// One handle of a C library (a cuDNN descriptor, a CUDA stream or event), destroyed with its
// owner by the library's own function: Handle<cudnnFilterDescriptor_t,
// cudnnDestroyFilterDescriptor>. Made by the library's create call through out() (CUDNN_CHECK(
// cudnnCreateFilterDescriptor(f.out()))), so a check that throws after it leaks nothing. Moves,
// never copies. Header-only and free of the libraries' headers: core/ is built without CUDA too.
#pragma once

#include <utility>

namespace hpc {

template <class H, auto Destroy>
class Handle {
 public:
  Handle() = default;
  ~Handle() { reset(); }
  Handle(Handle&& o) noexcept : h_(std::exchange(o.h_, H{})) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = std::exchange(o.h_, H{});
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  H get() const { return h_; }
  explicit operator bool() const { return h_ != H{}; }
  // Where a create call writes the new handle (any held one is destroyed first).
  H* out() {
    reset();
    return &h_;
  }
  void reset() {
    if (h_ != H{}) Destroy(std::exchange(h_, H{}));
  }

 private:
  H h_{};
};

}  // namespace hpc

// Tensor: a shape, a dtype, a device and a view into reference-counted owning storage.
// Views share storage, which is how layers hold their slices of the parameter and gradient
// arenas (DESIGN.md principle 1). Host storage is 64-byte aligned for AVX-512 loads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace hpc {

// BF16 and F16: device activations of mixed-precision training (nn/cuda), never host math.
enum class DType : uint8_t { F32, F64, I32, U8, BF16, F16 };
enum class DeviceKind : uint8_t { CPU, CUDA };

size_t dtype_size(DType t);
const char* dtype_name(DType t);

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::F32; }
template <> constexpr DType dtype_of<double>() { return DType::F64; }
template <> constexpr DType dtype_of<int32_t>() { return DType::I32; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::U8; }

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : dims_(dims) {}
  explicit Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {}
  size_t rank() const { return dims_.size(); }
  int64_t operator[](size_t i) const { return dims_.at(i); }
  int64_t& operator[](size_t i) { return dims_.at(i); }
  int64_t numel() const;
  const std::vector<int64_t>& dims() const { return dims_; }
  bool operator==(const Shape& o) const = default;
  std::string str() const;  // "[64, 28, 28, 1]"

 private:
  std::vector<int64_t> dims_;
};

// Owning storage on one device, zero-filled: 64-byte aligned host memory, or device memory
// from the caching allocator (core/device.hpp; a usage error in a build without CUDA).
class Storage {
 public:
  // pinned (host only): page-locked where the machine has a GPU to copy to, else ordinary.
  Storage(size_t bytes, DeviceKind device, bool pinned = false);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() { return data_; }
  size_t bytes() const { return bytes_; }
  DeviceKind device() const { return device_; }
  bool pinned() const { return pinned_; }  // page-locked (asked for and had)
  bool pinned_request() const { return asked_pinned_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  DeviceKind device_;
  bool pinned_ = false, asked_pinned_ = false;
};

class Tensor {
 public:
  Tensor() = default;
  // Allocates zero-filled storage.
  Tensor(Shape shape, DType dtype, DeviceKind device = DeviceKind::CPU);

  template <class T>
  static Tensor zeros(Shape shape) { return Tensor(std::move(shape), dtype_of<T>()); }
  // Host memory a GPU copies from directly (page-locked) where there is a GPU; ordinary host
  // memory elsewhere. resize() keeps asking for it.
  static Tensor pinned(Shape shape, DType dtype);
  bool pinned() const { return storage_ && storage_->pinned(); }

  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  DeviceKind device() const { return storage_ ? storage_->device() : DeviceKind::CPU; }
  int64_t numel() const { return shape_.numel(); }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool defined() const { return storage_ != nullptr; }

  template <class T>
  T* data() const {
    HPC_CHECK(dtype_of<T>() == dtype_, "tensor holds ", dtype_name(dtype_));
    return reinterpret_cast<T*>(raw());
  }
  void* raw() const;

  // A view of `count` elements starting at element `offset`, with a new shape.
  Tensor view(int64_t offset, Shape shape) const;
  // Same storage, new shape with the same number of elements.
  Tensor reshape(Shape shape) const;
  void fill_zero();
  // Gives the tensor `shape`, reusing its storage when that is large enough (activation
  // buffers grow to the largest batch once and are then reused every step).
  void resize(Shape shape, DType dtype);
  template <class T>
  void resize(Shape shape) { resize(std::move(shape), dtype_of<T>()); }

 private:
  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;  // in elements
  Shape shape_;
  DType dtype_ = DType::F32;
};

}  // namespace hpc

#include "core/tensor.hpp"

#include "core/device.hpp"

#include <cstdlib>
#include <cstring>
#include <sstream>

namespace hpc {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::I32: return 4;
    case DType::U8: return 1;
    case DType::BF16:
    case DType::F16: return 2;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::I32: return "i32";
    case DType::U8: return "u8";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
  }
  return "?";
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int64_t d : dims_) n *= d;
  return n;
}

std::string Shape::str() const {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < dims_.size(); ++i) os << (i ? ", " : "") << dims_[i];
  os << "]";
  return os.str();
}

Storage::Storage(size_t bytes, DeviceKind device, bool pinned)
    : bytes_(bytes), device_(device), asked_pinned_(pinned && device == DeviceKind::CPU) {
  if (device == DeviceKind::CUDA) {  // the device's caching allocator (core/device.hpp)
    data_ = device::allocate(bytes);
    device::zero(data_, bytes);
    return;
  }
  if (asked_pinned_ && (data_ = device::allocate_pinned(bytes)) != nullptr) {
    pinned_ = true;
    std::memset(data_, 0, bytes);
    return;
  }
  constexpr size_t kAlign = 64;
  size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  data_ = std::aligned_alloc(kAlign, rounded ? rounded : kAlign);
  if (!data_) throw Error(ErrorKind::Internal, detail::concat("out of memory allocating ", bytes, " bytes"));
  std::memset(data_, 0, rounded ? rounded : kAlign);
}

Storage::~Storage() {
  if (device_ == DeviceKind::CUDA) device::release(data_);
  else if (pinned_) device::release_pinned(data_);
  else std::free(data_);
}

Tensor::Tensor(Shape shape, DType dtype, DeviceKind device)
    : storage_(std::make_shared<Storage>(static_cast<size_t>(shape.numel()) * dtype_size(dtype), device)),
      shape_(std::move(shape)),
      dtype_(dtype) {
  for (int64_t d : shape_.dims()) HPC_CHECK(d >= 0, "negative dimension in ", shape_.str());
}

Tensor Tensor::pinned(Shape shape, DType dtype) {
  for (int64_t d : shape.dims()) HPC_CHECK(d >= 0, "negative dimension in ", shape.str());
  Tensor t;
  t.storage_ = std::make_shared<Storage>(static_cast<size_t>(shape.numel()) * dtype_size(dtype), DeviceKind::CPU, true);
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  return t;
}

void* Tensor::raw() const {
  if (!storage_) return nullptr;
  return static_cast<char*>(storage_->data()) + offset_ * static_cast<int64_t>(dtype_size(dtype_));
}

Tensor Tensor::view(int64_t offset, Shape shape) const {
  HPC_CHECK(offset >= 0 && offset + shape.numel() <= numel(), "view ", offset, "+", shape.str(),
            " outside tensor of ", numel(), " elements");
  Tensor t = *this;
  t.offset_ = offset_ + offset;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::reshape(Shape shape) const {
  HPC_CHECK(shape.numel() == numel(), "reshape ", shape_.str(), " to ", shape.str());
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

void Tensor::resize(Shape shape, DType dtype) {
  size_t need = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  if (!storage_ || storage_->bytes() < need + static_cast<size_t>(offset_) * dtype_size(dtype_)) {
    *this = storage_ && storage_->pinned_request() ? Tensor::pinned(std::move(shape), dtype)
                                                   : Tensor(std::move(shape), dtype, device());
    return;
  }
  shape_ = std::move(shape);
  dtype_ = dtype;
  offset_ = 0;
}

void Tensor::fill_zero() {
  if (!defined()) return;
  if (device() == DeviceKind::CUDA) device::zero(raw(), bytes());
  else std::memset(raw(), 0, bytes());
}

}  // namespace hpc

#include "core/arena.hpp"

namespace hpc {
namespace {
constexpr int64_t kAlignElems = 16;  // 64 bytes of float; plenty for double's 8-element vectors
int64_t align_up(int64_t n) { return (n + kAlignElems - 1) / kAlignElems * kAlignElems; }
}  // namespace

template <class T>
int ParamStore<T>::add_param(std::string name, Shape shape, ParamRole role, int64_t fan_in, double init_gain) {
  HPC_CHECK(!allocated(), "parameter ", name, " declared after allocation");
  params_.push_back({std::move(name), std::move(shape), role, 0, fan_in, init_gain});
  return static_cast<int>(params_.size()) - 1;
}

template <class T>
int ParamStore<T>::add_buffer(std::string name, Shape shape, double init) {
  HPC_CHECK(!allocated(), "buffer ", name, " declared after allocation");
  buffer_slots_.push_back({std::move(name), std::move(shape), init, 0});
  return static_cast<int>(buffer_slots_.size()) - 1;
}

template <class T>
void ParamStore<T>::allocate() {
  HPC_CHECK(!allocated(), "arenas allocated twice");
  int64_t total = 0;
  for (auto& s : params_) {
    s.offset = total;
    total = align_up(total + s.shape.numel());
  }
  values_ = Tensor::zeros<T>(Shape{total});
  grads_ = Tensor::zeros<T>(Shape{total});
  int64_t btotal = 0;
  for (auto& b : buffer_slots_) {
    b.offset = btotal;
    btotal = align_up(btotal + b.shape.numel());
  }
  buffers_ = Tensor::zeros<T>(Shape{btotal});
  for (auto& b : buffer_slots_) {
    T* p = buffers_.data<T>() + b.offset;
    for (int64_t i = 0; i < b.shape.numel(); ++i) p[i] = static_cast<T>(b.init);
  }
}

template <class T>
int64_t ParamStore<T>::param_count() const {
  int64_t n = 0;
  for (const auto& s : params_) n += s.shape.numel();
  return n;
}

template class ParamStore<float>;
template class ParamStore<double>;

}  // namespace hpc

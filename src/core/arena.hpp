// The parameter, gradient and buffer arenas (DESIGN.md principle 1). Layers declare their
// parameters during model set-up; allocate() then lays them out contiguously, in declaration
// (= forward) order, each slot aligned to 64 bytes. Gradients share the parameters' layout,
// so a gradient bucket is a contiguous slice and an optimizer is one pass over two arrays.
// Buffers (batch-norm running statistics) are state, not trained, and live in their own arena.
#pragma once

#include <string>
#include <vector>

#include "core/tensor.hpp"

namespace hpc {

// Why the role is kept: weight decay applies to weights only unless asked (a table,
// never index magic), and initialisation depends on it.
enum class ParamRole { Weight, Bias, NormScale, NormShift };

struct ParamSlot {
  std::string name;
  Shape shape;
  ParamRole role;
  int64_t offset = 0;  // elements from the start of the arena
  int64_t fan_in = 1;  // for Kaiming initialisation of weights (and of biases under kaiming-uniform)
  double init_gain = 1;  // multiplies the Kaiming standard deviation (0: start at zero)
};

struct BufferSlot {
  std::string name;
  Shape shape;
  double init = 0;
  int64_t offset = 0;
};

template <class T>
class ParamStore {
 public:
  int add_param(std::string name, Shape shape, ParamRole role, int64_t fan_in = 1, double init_gain = 1);
  int add_buffer(std::string name, Shape shape, double init);
  void allocate();
  bool allocated() const { return values_.defined(); }

  T* value(int id) const { return values_.data<T>() + params_.at(id).offset; }
  T* grad(int id) const { return grads_.data<T>() + params_.at(id).offset; }
  T* buffer(int id) const { return buffers_.data<T>() + buffer_slots_.at(id).offset; }

  Tensor& values() { return values_; }
  Tensor& grads() { return grads_; }
  Tensor& buffers() { return buffers_; }
  const Tensor& values() const { return values_; }
  const Tensor& grads() const { return grads_; }
  const Tensor& buffers() const { return buffers_; }
  const std::vector<ParamSlot>& slots() const { return params_; }
  const std::vector<BufferSlot>& buffer_slots() const { return buffer_slots_; }
  int64_t param_count() const;  // trainable elements, without alignment padding

 private:
  std::vector<ParamSlot> params_;
  std::vector<BufferSlot> buffer_slots_;
  Tensor values_, grads_, buffers_;
};

}  // namespace hpc

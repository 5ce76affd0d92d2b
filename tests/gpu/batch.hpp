// A random batch for the GPU tests: n inputs of the model's input shape drawn from N(0, 1)
// and n labels in 0..9, from one seed (inputs first, then labels), on the host for the CPU
// reference and copied to the device for the GPU network.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "core/device.hpp"
#include "core/tensor.hpp"
#include "nn/layer.hpp"

namespace hpc::testing {

struct RandomBatch {
  Tensor x;                     // host, F32
  std::vector<int32_t> labels;  // host
  Tensor x_device, labels_device;
};

inline RandomBatch random_batch(int64_t n, const Shape& input, unsigned seed) {
  RandomBatch b;
  b.x = Tensor::zeros<float>(nn::batch_shape(n, input));
  std::mt19937 g(seed);
  std::normal_distribution<float> normal(0, 1);
  for (int64_t i = 0; i < b.x.numel(); ++i) b.x.data<float>()[i] = normal(g);
  b.labels.resize(static_cast<size_t>(n));
  for (auto& l : b.labels) l = static_cast<int32_t>(g() % 10);
  b.x_device = Tensor(b.x.shape(), DType::F32, DeviceKind::CUDA);
  b.labels_device = Tensor(Shape{n}, DType::I32, DeviceKind::CUDA);
  device::copy(b.x_device.raw(), b.x.raw(), b.x.bytes(), device::Copy::HostToDevice);
  device::copy(b.labels_device.raw(), b.labels.data(), b.labels.size() * sizeof(int32_t), device::Copy::HostToDevice);
  return b;
}

}  // namespace hpc::testing

// Where `hpctrain predict` runs the model: the host model in eval mode on the CPU, or its
// mirror on this rank's GPU (nn/cuda's GpuNetwork, the network the GPU engine evaluates with),
// in fp32 so that both give the CPU's answers up to rounding. inference_gpu.cpp is compiled
// with GPU training (CUDA, cuDNN, NCCL), inference_gpu_none.cpp otherwise (DESIGN.md
// principle 2: a missing backend is a usage error, never a silent fallback).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/tensor.hpp"
#include "nn/model.hpp"

namespace hpc::train {

class Inference {
 public:
  virtual ~Inference() = default;
  // The logits (n x classes, row-major) of a batch of normalised images (n x H x W x C floats
  // on the host).
  virtual void logits(const Tensor& images, std::vector<float>& out) = 0;
  // Where it runs, for the summary line.
  virtual std::string describe() const = 0;
};

std::unique_ptr<Inference> make_cpu_inference(nn::Model<float>& model, int threads);
// The GPU of this local rank, with the model's parameters uploaded. Usage error where the build
// or the machine has none.
std::unique_ptr<Inference> make_gpu_inference(nn::Model<float>& model, int local_rank);

}  // namespace hpc::train

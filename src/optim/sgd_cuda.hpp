// optim::Sgd on the GPU: the same update (kernels::sgd_step, bit-exact against Sgd<float>)
// over a device parameter arena with the host arena's layout (padding included), the decay
// table copied from the host optimizer, and the momentum buffer on the device. upload()/download() move the momentum
// buffer (resume, checkpoints). Compiled only with the CUDA toolkit.
#pragma once

#include <cuda_runtime_api.h>

#include "optim/sgd.hpp"

namespace hpc::optim {

class SgdCuda {
 public:
  explicit SgdCuda(const Sgd<float>& host);
  void upload(const Sgd<float>& host);
  void download(Sgd<float>& host) const;
  const Tensor& velocity() const { return velocity_; }  // the device momentum buffer
  // params and grads: device arenas of the host optimizer's size. skip: a device flag that,
  // when set, makes the step change nothing (an overflowed fp16 step); null: never. hyper:
  // device {lr, momentum} that replace the arguments (a step captured in a CUDA graph).
  void step(float* params, const float* grads, double lr, double momentum, cudaStream_t stream,
            const int* skip = nullptr, const float* hyper = nullptr);

 private:
  SgdSpec spec_;
  int64_t n_ = 0;
  Tensor velocity_, range_end_, range_decay_;  // device
  int ranges_ = 0;
};

}  // namespace hpc::optim

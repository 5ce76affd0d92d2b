#include "optim/sgd_cuda.hpp"

#include <vector>

#include "core/device.hpp"
#include "kernels/kernels.hpp"

namespace hpc::optim {

SgdCuda::SgdCuda(const Sgd<float>& host)
    : spec_(host.spec()),
      n_(host.momentum_buffer().numel()),
      velocity_(host.momentum_buffer().shape(), DType::F32, DeviceKind::CUDA) {
  std::vector<int64_t> ends;
  std::vector<float> decays;
  for (const auto& r : host.ranges()) {
    ends.push_back(r.end);
    decays.push_back(r.decay ? static_cast<float>(spec_.weight_decay) : 0.0f);
  }
  HPC_CHECK(!ends.empty() && ends.back() <= n_, "SGD decay table ends at ", ends.empty() ? 0 : ends.back(),
            ", past the arena's end ", n_);
  // The kernel walks the whole arena, alignment padding included. Padding before a tensor falls
  // in that tensor's range; the tail after the last one gets a range of its own. Its
  // parameters and gradients are zero and stay zero.
  if (ends.back() < n_) {
    ends.push_back(n_);
    decays.push_back(0.0f);
  }
  ranges_ = static_cast<int>(ends.size());
  // int64 table stored in a float-typed device tensor of twice the length: raw bytes.
  range_end_ = Tensor(Shape{2 * static_cast<int64_t>(ends.size())}, DType::F32, DeviceKind::CUDA);
  range_decay_ = Tensor(Shape{static_cast<int64_t>(decays.size())}, DType::F32, DeviceKind::CUDA);
  device::copy(range_end_.raw(), ends.data(), ends.size() * sizeof(int64_t), device::Copy::HostToDevice);
  device::copy(range_decay_.raw(), decays.data(), decays.size() * sizeof(float), device::Copy::HostToDevice);
}

void SgdCuda::upload(const Sgd<float>& host) {
  device::copy(velocity_.raw(), host.momentum_buffer().raw(), velocity_.bytes(), device::Copy::HostToDevice);
}

void SgdCuda::download(Sgd<float>& host) const {
  device::copy(host.momentum_buffer().raw(), velocity_.raw(), velocity_.bytes(), device::Copy::DeviceToHost);
}

void SgdCuda::step(float* params, const float* grads, double lr, double momentum, cudaStream_t stream,
                   const int* skip, const float* hyper) {
  kernels::sgd_step(params, grads, velocity_.data<float>(), n_, static_cast<const int64_t*>(range_end_.raw()),
                    range_decay_.data<float>(), ranges_, static_cast<float>(lr), static_cast<float>(momentum),
                    spec_.nesterov, sgd_fuses_multiply_add(), stream, skip, hyper);
}

}  // namespace hpc::optim

// GpuNetwork: a host nn::Model mirrored on the GPU. The host model stays the owner of the
// architecture, the parameter layout and the initialisation (identical on every machine);
// this class builds one GPU layer per CPU layer, holds device arenas with the host's layout,
// and runs forward, the fused softmax cross-entropy and backward on the compute stream.
// upload()/download() move the state between the two (resume, checkpoints, the checksum).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "nn/cuda/layers.hpp"
#include "nn/model.hpp"

namespace hpc::nn::cuda {

class GpuNetwork {
 public:
  GpuNetwork(GpuContext& ctx, const Model<float>& host);

  // Host parameters and buffers to the device, and back (both synchronous).
  void upload(const ParamStore<float>& host);
  void download(ParamStore<float>& host);

  // x: a device batch of fp32, N x H x W x C. Returns the fp32 logits (N x classes). In mixed
  // precision the batch is converted to the activations' type first and the logits back, and
  // the whole value arena to its 16-bit copy (one launch, DeviceArenas::refresh_low).
  const Tensor& forward(const Tensor& x, bool train);
  // Softmax cross-entropy of the last forward against device labels: enqueues the loss sum
  // and the count of correct predictions into device memory; sums() reads them.
  void loss(const Tensor& logits, const int32_t* labels);
  // Backward from the last loss() (times the context's loss scale); grads_ready(offset) is
  // called (on this thread, after the work is enqueued, not done) whenever every gradient at
  // arena offsets >= offset is final. In mixed precision the convolutions' weight gradients
  // reach the fp32 arena only when land_grads() is enqueued (DeviceArenas): whatever reads them
  // on the device before backward returns (a bucket's all-reduce) calls it first. With `land`
  // false the backward pass leaves that to the caller: the engine's NCCL buckets, each of which
  // lands what is deferred before its all-reduce (every gradient lies in a bucket queued after
  // it was deferred), so that the landing a bucket needs is the only one.
  void backward(const std::function<void(int64_t)>& grads_ready, bool land = true);
  // The weight gradients deferred so far, converted into the fp32 arena (one launch; nothing
  // when none is deferred). backward() calls it at its end unless told not to.
  void land_grads() { arenas_.land_grads(ctx_.grad_factor(), ctx_.stream()); }
  // The last loss()'s sums: one copy and one wait for the stream.
  struct LossSums {
    double loss = 0;  // summed over the batch's rows
    int64_t correct = 0;
  };
  LossSums sums();

  DeviceArenas& arenas() { return arenas_; }
  GpuContext& context() { return ctx_; }

 private:
  GpuContext& ctx_;
  const Model<float>& host_;
  DeviceArenas arenas_;
  std::unique_ptr<GpuSequential> net_;
  std::vector<int64_t> group_offset_;  // per top-level layer: its first gradient's offset, or -1
  Tensor prob_, dlogits_, row_loss_;
  Tensor x_low_, logits_, dlogits_low_;  // mixed precision: the conversions at the ends
  Tensor sums_;  // device: [0] the loss sum (double), [1] the correct count (int)
  int64_t rows_ = 0;
};

}  // namespace hpc::nn::cuda

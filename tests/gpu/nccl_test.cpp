// The NCCL communicator at world size 1 on one GPU: creation, every collective, duplicate, the
// gradients' weighted sums. (The bucketing above it is the GradientBucketer, tested on the CPU;
// train_gpu_test runs the bucketed path on one GPU through HPCTRAIN_TEST_FORCE_NCCL=1.) Skips
// where no GPU is visible.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <vector>

#include "core/device.hpp"
#include "dist/nccl.hpp"

namespace hpc::dist {
namespace {

TEST(Nccl, EveryCollectiveRunsOnOneGpu) {
  if (device::cuda_device_count() == 0)
    GTEST_SKIP() << "no CUDA GPU visible (" << device::describe() << "): NCCL test skipped";
  device::select_gpu(0);
  SelfCommunicator self;
  NcclCommunicator nccl(self);
  EXPECT_EQ(nccl.rank(), 0);
  EXPECT_EQ(nccl.size(), 1);
  const std::vector<float> host{1.5f, -2.f, 3.25f};
  auto* d = static_cast<float*>(device::allocate(host.size() * sizeof(float)));
  device::copy(d, host.data(), host.size() * sizeof(float), device::Copy::HostToDevice);
  nccl.allreduce_sum(d, 3);
  nccl.broadcast(d, 3 * sizeof(float), 0);
  std::vector<float> back(3);
  device::copy(back.data(), d, back.size() * sizeof(float), device::Copy::DeviceToHost);
  EXPECT_EQ(back, host);
  EXPECT_EQ(nccl.allgather(42), std::vector<uint64_t>{42});
  nccl.barrier();
  auto twin = nccl.duplicate();
  twin->allreduce_sum(d, 3);
  twin->barrier();
  device::release(d);
}

// The gradients' reduction, which returns before it is done: ncclAvg where the share is
// 1 / size (at size 1, each value itself), a pre-multiplied sum otherwise (x 0.5, exact); and
// no asynchronous error to report.
TEST(Nccl, WeightedSumsAreEnqueuedOnTheStream) {
  if (device::cuda_device_count() == 0)
    GTEST_SKIP() << "no CUDA GPU visible (" << device::describe() << "): NCCL test skipped";
  device::select_gpu(0);
  SelfCommunicator self;
  NcclCommunicator nccl(self);
  const std::vector<float> host{1.5f, -2.f, 3.25f, 1e-30f};
  const size_t bytes = host.size() * sizeof(float);
  auto* d = static_cast<float*>(device::allocate(bytes));
  device::copy(d, host.data(), bytes, device::Copy::HostToDevice);
  nccl.enqueue_weighted_sum(d, 4, 1.0f);
  nccl.enqueue_weighted_sum(d, 4, 0.5f);
  std::vector<float> back(host.size());
  ASSERT_EQ(cudaMemcpyAsync(back.data(), d, bytes, cudaMemcpyDeviceToHost, nccl.stream()), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(nccl.stream()), cudaSuccess);
  for (size_t i = 0; i < host.size(); ++i) EXPECT_EQ(back[i], host[i] * 0.5f) << i;
  EXPECT_EQ(nccl.async_error(), "");
  device::release(d);
}

}  // namespace
}  // namespace hpc::dist

// The NCCL communicator at world size 1 on one GPU: creation, every collective, duplicate.
// (The multi-rank logic above it, the GradientBucketer, is the same code tested with MPI on
// the CPU.) Skips where no GPU is visible.
#include <gtest/gtest.h>

#include <vector>

#include "core/device.hpp"
#include "dist/nccl.hpp"

namespace hpc::dist {
namespace {

// The bootstrap of a world of one: nothing to send anywhere.
class SelfCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void allreduce_sum(float*, int64_t) override {}
  void allreduce_sum(double*, int64_t) override {}
  void broadcast(void*, int64_t, int) override {}
  std::vector<uint64_t> allgather(uint64_t v) override { return {v}; }
  void barrier() override {}
  std::unique_ptr<Communicator> duplicate() override { return std::make_unique<SelfCommunicator>(); }
  [[noreturn]] void abort(int code) override { std::exit(code); }
};

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

}  // namespace
}  // namespace hpc::dist

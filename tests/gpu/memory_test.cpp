// The GPU memory tests that need the whole device: each takes nearly all of its free memory, so
// they run alone (tests/CMakeLists.txt: RUN_SERIAL), never beside the other GPU tests that
// bench/gpu_vs_peer.sh runs four at a time (which would then fail to allocate).
// Skips where no GPU is visible.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/device.hpp"
#include "core/error.hpp"
#include "core/tensor.hpp"
#include "gpu/batch.hpp"
#include "nn/cuda/network.hpp"
#include "nn/model.hpp"

namespace hpc {
namespace {
// --no-deterministic searches cuDNN's algorithms with cudnnFind*, which takes the memory it runs
// them on with cudaMalloc of its own. At a batch shape first seen late in a run (an evaluation
// batch, the last smaller one) the caching allocator holds the freed buffers of whole steps:
// here, nearly all of the GPU's free memory, cached as a long run leaves it. The search of a
// new shape must still succeed (the layers give the cache back first), for the training step's
// convolutions (forward, backward filter, backward data) and an evaluation batch of another size.
// Without that, cuDNN cannot even allocate the first convolution's output: ALLOC_FAILED.
size_t free_device_memory() {
  size_t free = 0, total = 0;
  EXPECT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  return free;
}

// Takes the device's free memory through the caching allocator down to a few MiB, then
// releases it all into the cache (where a step's freed buffers stay).
void cache_the_free_memory() {
  constexpr size_t kMiB = size_t{1} << 20;
  std::vector<void*> held;
  for (size_t chunk : {256 * kMiB, 16 * kMiB, 2 * kMiB}) {
    while (free_device_memory() > chunk + 8 * kMiB) {
      try {
        held.push_back(device::allocate(chunk));
      } catch (const Error&) {
        break;  // fragmentation: the next smaller chunk goes on
      }
    }
  }
  for (void* p : held) device::release(p);
}

TEST(GpuConvolutionSearch, FindsAlgorithmsWhileTheCacheHoldsTheFreeMemory) {
  if (device::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU visible: skipped";
  device::select_gpu(0);
  constexpr size_t kMiB = size_t{1} << 20;
  nn::ModelSpec spec;  // the cnn: its first convolution's output is 98 MiB at 1024 images
  nn::Model<float> cpu(spec);
  cpu.init(11);
  nn::cuda::GpuContext ctx({nn::cuda::Math::Fp32, /*deterministic=*/false});
  nn::cuda::GpuNetwork gpu(ctx, cpu);
  gpu.upload(cpu.params());
  const int64_t n = 1024, m = 1000;
  const testing::RandomBatch b = testing::random_batch(n, spec.input, 13);
  const Tensor &xd = b.x_device, &ld = b.labels_device;
  Tensor xm(nn::batch_shape(m, spec.input), DType::F32, DeviceKind::CUDA);
  device::copy(xm.raw(), b.x.raw(), static_cast<size_t>(xm.numel()) * sizeof(float), device::Copy::HostToDevice);

  struct GiveBackAtEnd {  // the memory back for the tests after this one, however this one ends
    ~GiveBackAtEnd() { device::empty_cache(); }
  } give_back;
  cache_the_free_memory();
  ASSERT_LT(free_device_memory(), 64 * kMiB) << "the test needs the free memory in the cache";
  EXPECT_NO_THROW({
    gpu.loss(gpu.forward(xd, true), ld.data<int32_t>());
    gpu.backward([](int64_t) {});
  });
  EXPECT_TRUE(std::isfinite(gpu.sums().loss));

  cache_the_free_memory();
  ASSERT_LT(free_device_memory(), 64 * kMiB);
  EXPECT_NO_THROW({
    gpu.loss(gpu.forward(xm, false), ld.data<int32_t>());
    EXPECT_TRUE(std::isfinite(gpu.sums().loss));
  });
}

}  // namespace
}  // namespace hpc

// The emulation behind kernels_emu_test (tests/emu/cuda_emu.hpp) on kernels of its own: what a
// GPU guarantees holds (a barrier orders a block's shared memory, a shuffle reads the partner's
// value, __syncthreads_or sees every thread's flag), what a GPU leaves undefined comes out wrong
// (a race between threads or blocks, shared memory read before the block wrote it), and what a
// GPU would fail on fails here too (a trap, a barrier some live thread never reaches, a shuffle
// from a lane that left, an access past a buffer's end, a misaligned access, a thread's stack
// overflowed), each with one clear line. This file is CUDA: it is built as the kernels are, through emulate_cu.py, its
// launches and __shared__ declarations rewritten.
#include "emu/cuda_emu.hpp"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace {

constexpr int kThreads = 64;

// Block b reverses its 64 values through shared memory: right only if the barrier holds every
// thread until all have written.
void reverse_kernel(const int* in, int* out) {
  __shared__ int s[kThreads];
  const int base = blockIdx.x * kThreads;
  s[threadIdx.x] = in[base + threadIdx.x];
  __syncthreads();
  out[base + threadIdx.x] = s[kThreads - 1 - threadIdx.x];
}

// Each warp's butterfly sum of its lanes' numbers; lane 0 writes it.
void warp_sum_kernel(int* out) {
  int v = static_cast<int>(threadIdx.x);
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) out[threadIdx.x / 32] = v;
}

void any_kernel(int flagged, int* out) {
  const int any = __syncthreads_or(static_cast<int>(threadIdx.x) == flagged);
  if (threadIdx.x == 0) out[blockIdx.x] = any;
}

void trap_kernel(int at) {
  if (static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x) == at) __trap();
}

// Lane 0 of the warp waits for the block while the other lanes wait for it in a shuffle.
void deadlock_kernel() {
  if (threadIdx.x == 0) __syncthreads();
  else (void)__shfl_xor_sync(0xffffffffu, 1, 1);
}

// Lane 5 leaves before the warp's shuffle.
void shuffle_after_exit_kernel(int* out) {
  if (threadIdx.x == 5) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, static_cast<int>(threadIdx.x), 1);
}

void write_past_kernel(int* p, int n) { p[n + static_cast<int>(threadIdx.x)] = 1; }

// Four floats as one 16-byte access (as the kernels' Pack), from p + offset.
struct alignas(16) Four {
  float v[4];
};
void load_four_kernel(const float* p, int offset, float* out) {
  const Four f = *reinterpret_cast<const Four*>(p + offset);
  out[threadIdx.x] = f.v[threadIdx.x];
}

// About 1 KiB of stack for each of `depth` calls.
int deep(int depth) {
  volatile char frame[1024];
  frame[depth % 1024] = static_cast<char>(depth);
  return depth == 0 ? 0 : deep(depth - 1) + frame[depth % 1024];
}
void deep_kernel(int depth, int* out) { out[threadIdx.x] = deep(depth); }

// Each thread writes its value to shared memory and reads its neighbour's, `step` away: with
// the barrier, or racing (a read before the neighbour's write is ordered before it).
void neighbour_kernel(int step, bool barrier, int* out) {
  __shared__ int s[kThreads];
  const int t = static_cast<int>(threadIdx.x);
  s[t] = 1000 * static_cast<int>(blockIdx.x) + t;
  if (barrier) __syncthreads();
  const int from = t + step;
  out[blockIdx.x * kThreads + t] = from >= 0 && from < kThreads ? s[from] : -2;
}

// Block b > 0 copies what block b - 1 wrote in the same launch: a race between blocks, which
// no order of a GPU's guarantees.
void previous_block_kernel(int* out) {
  const int at = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  out[at] = blockIdx.x == 0 ? 1 : out[at - static_cast<int>(blockDim.x)] + 1;
}

// Block 0 fills shared memory; every block reads it.
void shared_left_by_another_block_kernel(int* out) {
  __shared__ int s[kThreads];
  if (blockIdx.x == 0) s[threadIdx.x] = 7;
  __syncthreads();
  out[blockIdx.x * kThreads + threadIdx.x] = s[threadIdx.x];
}

template <class T>
T* device_copy(const std::vector<T>& host) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, host.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return static_cast<T*>(p);
}

template <class T>
std::vector<T> host_copy(const T* p, size_t n) {
  std::vector<T> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

TEST(CudaEmulation, ABarrierOrdersSharedMemoryAndBlocksRunWithTheirOwnIndex) {
  std::vector<int> in(3 * kThreads);
  std::iota(in.begin(), in.end(), 0);
  int* d_in = device_copy(in);
  int* d_out = device_copy(std::vector<int>(in.size()));
  reverse_kernel<<<3, kThreads>>>(d_in, d_out);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<int> out = host_copy(d_out, in.size());
  for (int b = 0; b < 3; ++b)
    for (int t = 0; t < kThreads; ++t) ASSERT_EQ(out[b * kThreads + t], b * kThreads + kThreads - 1 - t) << b << " " << t;
  cudaFree(d_in);
  cudaFree(d_out);
}

TEST(CudaEmulation, AShuffleReadsThePartnersValueAndSyncthreadsOrSeesEveryFlag) {
  int* sums = device_copy(std::vector<int>(2));
  warp_sum_kernel<<<1, 64>>>(sums);
  EXPECT_EQ(host_copy(sums, 2), (std::vector<int>{31 * 32 / 2, (32 + 63) * 32 / 2}));
  int* any = device_copy(std::vector<int>(2, 7));
  any_kernel<<<2, 96>>>(95, any);
  EXPECT_EQ(host_copy(any, 2), (std::vector<int>{1, 1}));
  any_kernel<<<2, 96>>>(96, any);
  EXPECT_EQ(host_copy(any, 2), (std::vector<int>{0, 0}));
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  cudaFree(sums);
  cudaFree(any);
}

TEST(CudaEmulation, ALaunchCudaRefusesIsAnErrorOnce) {
  trap_kernel<<<1, 2048>>>(-1);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "not sticky";
}

// A neighbour's value read without the barrier: whichever side of it has the lower index, some
// block of a launch of several gets it wrong (its reader's turn came before its writer's).
TEST(CudaEmulation, ARaceBetweenABlocksThreadsGivesAWrongAnswer) {
  constexpr int kBlocks = 4;
  int* out = device_copy(std::vector<int>(kBlocks * kThreads));
  for (const int step : {-1, 1, -5, 17}) {
    int wrong_with_barrier = 0, wrong_racing = 0;
    for (const bool barrier : {true, false}) {
      neighbour_kernel<<<kBlocks, kThreads>>>(step, barrier, out);
      ASSERT_EQ(cudaGetLastError(), cudaSuccess);
      const std::vector<int> got = host_copy(out, kBlocks * kThreads);
      for (int b = 0; b < kBlocks; ++b)
        for (int t = 0; t < kThreads; ++t) {
          const int from = t + step;
          const int want = from >= 0 && from < kThreads ? 1000 * b + from : -2;
          (barrier ? wrong_with_barrier : wrong_racing) += got[b * kThreads + t] != want;
        }
    }
    EXPECT_EQ(wrong_with_barrier, 0) << "step " << step;
    EXPECT_GT(wrong_racing, 0) << "step " << step << ": the race gave the right answer in every block";
  }
  cudaFree(out);
}

// Blocks run in grid order in one launch and in reverse in the next: a block that reads another's
// output of the same launch gets it wrong in one of two.
TEST(CudaEmulation, ARaceBetweenBlocksGivesAWrongAnswer) {
  constexpr int kBlocks = 5;
  int* out = device_copy(std::vector<int>(kBlocks * kThreads));
  int launches_wrong = 0;
  for (int launch = 0; launch < 2; ++launch) {
    previous_block_kernel<<<kBlocks, kThreads>>>(out);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    const std::vector<int> got = host_copy(out, kBlocks * kThreads);
    bool wrong = false;
    for (int i = 0; i < kBlocks * kThreads; ++i) wrong = wrong || got[i] != i / kThreads + 1;
    launches_wrong += wrong;
    ASSERT_EQ(cudaMemset(out, 0, kBlocks * kThreads * sizeof(int)), cudaSuccess);
  }
  EXPECT_EQ(launches_wrong, 1);
}

// A block's shared memory is garbage until the block writes it: all ones (-1 here), not zeros
// and not what an earlier block left. Device memory nobody wrote is the same garbage.
TEST(CudaEmulation, SharedAndDeviceMemoryStartAsGarbage) {
  constexpr int kBlocks = 3;
  int* out = device_copy(std::vector<int>(kBlocks * kThreads));
  shared_left_by_another_block_kernel<<<kBlocks, kThreads>>>(out);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<int> got = host_copy(out, kBlocks * kThreads);
  for (int b = 0; b < kBlocks; ++b)
    for (int t = 0; t < kThreads; ++t) ASSERT_EQ(got[b * kThreads + t], b == 0 ? 7 : -1) << b << " " << t;
  void* fresh = nullptr;
  ASSERT_EQ(cudaMalloc(&fresh, 3 * sizeof(float)), cudaSuccess);
  EXPECT_TRUE(std::isnan(host_copy(static_cast<const float*>(fresh), 3)[2]));
  cudaFree(fresh);
  cudaFree(out);
}

// Each death test runs in a child process: the errors of a failed launch are sticky.
TEST(CudaEmulationDeathTest, ATrapFailsTheLaunchAndEveryCallAfterIt) {
  EXPECT_EXIT(
      {
        trap_kernel<<<4, 32>>>(77);
        const bool failed = cudaGetLastError() == cudaErrorLaunchFailure && cudaDeviceSynchronize() == cudaErrorLaunchFailure;
        std::exit(failed ? 3 : 0);
      },
      ::testing::ExitedWithCode(3), "block \\(2,0,0\\).*a thread trapped");
}

TEST(CudaEmulationDeathTest, ABarrierALiveThreadNeverReachesIsReportedNotHungOn) {
  EXPECT_EXIT(
      {
        deadlock_kernel<<<1, 32>>>();
        std::exit(cudaGetLastError() == cudaErrorLaunchFailure ? 3 : 0);
      },
      ::testing::ExitedWithCode(3), "a barrier that not every live thread");
}

TEST(CudaEmulationDeathTest, AShuffleFromALaneThatLeftFails) {
  EXPECT_EXIT(
      {
        int* out = device_copy(std::vector<int>(32));
        shuffle_after_exit_kernel<<<1, 32>>>(out);
        std::exit(cudaGetLastError() == cudaErrorLaunchFailure ? 3 : 0);
      },
      ::testing::ExitedWithCode(3), "a shuffle from a lane that did not take part");
}

TEST(CudaEmulationDeathTest, AnAccessPastABuffersEndFaultsWhereItHappens) {
  EXPECT_DEATH(
      {
        int* p = device_copy(std::vector<int>(100));
        write_past_kernel<<<1, 8>>>(p, 100);
      },
      "block \\(0,0,0\\) thread \\(0,0,0\\): an access outside device memory");
  int* p = device_copy(std::vector<int>(100));
  write_past_kernel<<<1, 4>>>(p, 96);  // the last four: inside
  EXPECT_EQ(host_copy(p, 100)[99], 1);
  cudaFree(p);
}

TEST(CudaEmulationDeathTest, AMisalignedAccessFailsWhereItHappens) {
#if defined(__clang__)
  GTEST_SKIP() << "Clang's alignment check does not look at a struct's copy (tests/CMakeLists.txt): GCC's builds only";
#endif
  EXPECT_DEATH(
      {
        float* p = device_copy(std::vector<float>(8));
        float* out = device_copy(std::vector<float>(4));
        load_four_kernel<<<1, 4>>>(p, 1, out);  // 4 bytes past a 16-byte boundary
      },
      "misaligned");
  float* p = device_copy(std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7});
  float* out = device_copy(std::vector<float>(4));
  load_four_kernel<<<1, 4>>>(p, 4, out);  // aligned
  EXPECT_EQ(host_copy(out, 4), (std::vector<float>{4, 5, 6, 7}));
  cudaFree(p);
  cudaFree(out);
}

TEST(CudaEmulationDeathTest, AThreadThatOverflowsItsStackFaultsWhereItHappens) {
  EXPECT_DEATH(
      {
        int* out = device_copy(std::vector<int>(4));
        deep_kernel<<<1, 4>>>(1000, out);
      },
      "thread \\(.,0,0\\): the thread's stack overflowed");
  int* out = device_copy(std::vector<int>(4));
  deep_kernel<<<1, 4>>>(100, out);  // 100 KiB: room enough
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  cudaFree(out);
}

}  // namespace

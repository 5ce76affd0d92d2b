// GPU-vs-CPU parity of hpctrain's own CUDA kernels (kernels/kernels.hpp), each against the CPU
// code it replaces, plus the device caching allocator on cudaMalloc. Every test skips, with
// the reason, where no GPU is visible (CTest reports it as skipped).
//
// Built twice: kernels_test, the kernels compiled by nvcc on a GPU (label gpu), and
// kernels_emu_test (HPCTRAIN_KERNELS_EMULATED, label unit), the same kernels emulated on the CPU
// (tests/emu/cuda_emu.hpp), which every build with the CUDA toolkit's headers runs. There the
// tests of nvJPEG and of real device memory are left out, and the largest cases are thinned
// (too_big_to_emulate, tunings_for): a launch that takes microseconds on a GPU takes
// milliseconds there.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/device.hpp"
#include "core/tensor.hpp"
#include "gpu/compare.hpp"
#include "core/rng.hpp"
#include "data/jpeg.hpp"
#include "data/loader.hpp"
#include "data/nvjpeg.hpp"
#include "data/shard_images.hpp"
#include "kernels/kernels.hpp"
#include "nn/model.hpp"
#include "optim/sgd.hpp"
#include "train/engine/cuda_memory.hpp"
#include "train/engine/engine.hpp"

namespace hpc {
namespace {

// A device copy of a host vector, and back.
template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const std::vector<T>& host) : n_(host.size()) {
    p_ = static_cast<T*>(device::allocate(bytes()));
    device::copy(p_, host.data(), bytes(), device::Copy::HostToDevice);
  }
  explicit DeviceBuffer(size_t n) : DeviceBuffer(std::vector<T>(n)) {}
  ~DeviceBuffer() { device::release(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return p_; }
  std::vector<T> host() const {
    std::vector<T> h(n_);
    device::copy(h.data(), p_, bytes(), device::Copy::DeviceToHost);  // synchronous: waits for the kernels
    return h;
  }

 private:
  size_t bytes() const { return n_ * sizeof(T); }
  size_t n_;
  T* p_ = nullptr;
};

std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

std::vector<float> host_of(const Tensor& t) {
  const float* p = t.data<float>();
  return std::vector<float>(p, p + t.numel());
}

Tensor tensor_of(const std::vector<float>& v, Shape shape) {
  Tensor t = Tensor::zeros<float>(std::move(shape));
  std::memcpy(t.data<float>(), v.data(), v.size() * sizeof(float));
  return t;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

#ifdef HPCTRAIN_KERNELS_EMULATED
constexpr bool kEmulated = true;
#else
constexpr bool kEmulated = false;
#endif

// A case of more elements than this is a GPU's alone: emulated, it would take seconds (other
// cases of the same test take each path of the kernel).
bool too_big_to_emulate(int64_t elements) { return kEmulated && elements > (int64_t{1} << 23); }

// The batch-norm launch choices case `index` of `cases` runs: on a GPU all of them; emulated, the
// default and the unfused choices index, index + cases, ... of the list (each with its fused
// twin), so that across the cases every choice runs once at least.
std::vector<kernels::BatchNormTuning> tunings_for(size_t index, size_t cases) {
  const std::vector<kernels::BatchNormTuning> all = kernels::batch_norm_tunings();
  if (!kEmulated) return all;
  std::set<std::string> chosen{kernels::batch_norm_tuning_text(all.front())};
  size_t unfused = 0;
  for (const kernels::BatchNormTuning& t : all)
    if (!t.fused_finalize && unfused++ % cases == index) chosen.insert(kernels::batch_norm_tuning_text(t));
  std::vector<kernels::BatchNormTuning> out;
  for (const kernels::BatchNormTuning& t : all) {
    kernels::BatchNormTuning twin = t;
    twin.fused_finalize = false;
    if (chosen.count(kernels::batch_norm_tuning_text(twin))) out.push_back(t);
  }
  return out;
}

class GpuKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (device::cuda_device_count() == 0)
      GTEST_SKIP() << "no CUDA GPU visible (" << device::describe() << "): GPU parity tests skipped";
    device::select_gpu(0);
  }
  void TearDown() override { kernels::set_batch_norm_tuning(tuning_); }  // a test that tunes puts it back
  kernels::BatchNormTuning tuning_ = kernels::batch_norm_tuning();  // the default, or HPCTRAIN_BN_TUNING's
  cudaStream_t stream_ = nullptr;  // the default stream; the copies back synchronise with it
};

// ---- the engine's and the JPEG decoder's own memory (train/engine/cuda_memory.hpp) ----------

namespace fake_memory {  // an allocator that can be told to fail, on the CPU
int allocations = 0, frees = 0;
size_t last_bytes = 0;
bool fail_next = false;
cudaError_t allocate(void** p, size_t bytes) {
  if (std::exchange(fail_next, false)) return cudaErrorMemoryAllocation;
  ++allocations;
  last_bytes = bytes;
  *p = std::malloc(bytes);
  return cudaSuccess;
}
cudaError_t release(void* p) {
  ++frees;
  std::free(p);
  return cudaSuccess;
}
}  // namespace fake_memory

// It only grows, keeping its block for smaller requests, and by half as much again at least (a
// request of 110 after 100 takes 150, and then 140 fits); a growth that fails leaves no block,
// not the freed one counted at its old size (the next request, however small, allocates
// again: a null pointer is never handed out). Runs without a GPU: the allocator is a stand-in.
TEST(CudaMemory, GrowsOnlyAndAFailedGrowthLeavesNoBlock) {
  {
    train::GrowingMemory<fake_memory::allocate, fake_memory::release> m;
    void* a = m.get(100);
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(m.get(50), a);
    EXPECT_EQ(m.get(100), a);
    EXPECT_EQ(fake_memory::allocations, 1);
    EXPECT_NE(m.get(110), nullptr);
    EXPECT_EQ(fake_memory::last_bytes, 150u);
    void* b = m.get(140);
    EXPECT_EQ(m.get(150), b);
    EXPECT_EQ(fake_memory::allocations, 2);
    EXPECT_EQ(fake_memory::frees, 1);
    EXPECT_NE(m.get(400), nullptr);  // more than half again: what is asked
    EXPECT_EQ(fake_memory::last_bytes, 400u);
    EXPECT_EQ(fake_memory::allocations, 3);
    fake_memory::fail_next = true;
    EXPECT_THROW(m.get(800), std::exception);
    EXPECT_EQ(fake_memory::frees, 3);  // the old block went before the failed request
    EXPECT_NE(m.get(10), nullptr);
    EXPECT_EQ(fake_memory::last_bytes, 10u);  // from no block: what is asked
    EXPECT_EQ(fake_memory::allocations, 4);
  }
  EXPECT_EQ(fake_memory::frees, fake_memory::allocations);
}

// The loader's pinned memory (device::allocate_pinned, release_pinned: cudaHostAlloc and
// cudaFreeHost, a device-wide synchronisation) waits while the main thread holds
// device::exclude_capture, as it does while it captures a step, and goes ahead once it is let go.
// A held exclusion never lets the call through, so the test cannot fail on a busy machine; with
// the exclusion left out of either call, the call ends while it is held.
TEST_F(GpuKernels, PinnedMemoryOfAnotherThreadWaitsForACaptureToEnd) {
  for (const bool allocating : {true, false}) {
    void* p = allocating ? nullptr : device::allocate_pinned(64);
    if (!allocating) {
      ASSERT_NE(p, nullptr);
    }
    std::atomic<bool> done{false};
    std::thread other;
    {
      const auto capturing = device::exclude_capture();
      other = std::thread([&] {
        if (allocating) {
          p = device::allocate_pinned(64);
        } else {
          device::release_pinned(p);
        }
        done = true;
      });
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      EXPECT_FALSE(done.load()) << (allocating ? "allocate_pinned" : "release_pinned") << " ran during a capture";
    }
    other.join();
    EXPECT_TRUE(done.load());
    if (allocating) {
      EXPECT_NE(p, nullptr);
      device::release_pinned(p);
    }
  }
}

#ifndef HPCTRAIN_KERNELS_EMULATED  // a GPU's alone
// What the exclusion is for: a step captured (thread-local mode, as the engine's) while another
// thread frees pinned memory and grows a device buffer, which it does through the exclusion,
// ends its capture whole and replays.
TEST_F(GpuKernels, ACaptureHoldsWhileAnotherThreadFreesMemory) {
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  DeviceBuffer<float> y(1 << 16);
  void* pinned = device::allocate_pinned(1 << 20);
  ASSERT_NE(pinned, nullptr);
  cudaGraph_t g = nullptr;
  cudaError_t began = cudaSuccess, set = cudaSuccess, ended = cudaSuccess;
  std::thread other;
  {
    const auto capturing = device::exclude_capture();
    began = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    other = std::thread([&] {
      device::release_pinned(pinned);
      const auto excluded = device::exclude_capture();  // as the GPU decoder's batch takes it
      train::DeviceBuffer grown;
      grown.get(1 << 20);
      grown.get(1 << 22);  // a cudaFree, then a cudaMalloc
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (began == cudaSuccess) {
      set = cudaMemsetAsync(y.get(), 0, (1 << 16) * sizeof(float), s);
      ended = cudaStreamEndCapture(s, &g);
    }
  }
  other.join();  // (before any assertion returns: a thread left joinable would abort the test)
  ASSERT_EQ(began, cudaSuccess);
  ASSERT_EQ(set, cudaSuccess);
  ASSERT_EQ(ended, cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, g, 0), cudaSuccess);
  EXPECT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
}

// The real ones: pinned host memory and device memory, a round trip through both.
TEST_F(GpuKernels, PinnedAndDeviceBuffersHoldWhatIsCopiedThrough) {
  train::PinnedBuffer pinned;
  train::DeviceBuffer device;
  for (size_t n : {size_t{16}, size_t{1} << 20, size_t{64}}) {
    auto* host = static_cast<unsigned char*>(pinned.get(n));
    for (size_t i = 0; i < n; ++i) host[i] = static_cast<unsigned char>(i * 7 + n);
    void* d = device.get(n);
    ASSERT_EQ(cudaMemcpy(d, host, n, cudaMemcpyHostToDevice), cudaSuccess);
    std::vector<unsigned char> back(n);
    ASSERT_EQ(cudaMemcpy(back.data(), d, n, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(std::memcmp(back.data(), host, n), 0) << n << " bytes";
  }
}
#endif

TEST_F(GpuKernels, ReluForwardAndBackwardEqualTheCpuLayer) {
  const int64_t n = 3 * 50000 + 7;
  std::vector<float> x = random_floats(n, 1), dy = random_floats(n, 2);
  x[0] = 0.f, x[1] = -0.f;
  nn::ReLU<float> cpu;
  const Tensor xt = tensor_of(x, {n, 1});
  const std::vector<float> y_cpu = host_of(cpu.forward(xt, true));
  const std::vector<float> dx_cpu = host_of(cpu.backward(tensor_of(dy, {n, 1}), true));
  DeviceBuffer<float> dx_(x), y(n), ddy(dy), ddx(n);
  kernels::relu_forward(dx_.get(), y.get(), n, stream_);
  kernels::relu_backward(y.get(), ddy.get(), ddx.get(), n, stream_);
  const auto y_gpu = y.host(), dx_gpu = ddx.host();
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(same_bits(y_gpu[i], y_cpu[i])) << i;
    ASSERT_TRUE(same_bits(dx_gpu[i], dx_cpu[i])) << i;
  }
}

TEST_F(GpuKernels, AddAndScaleAreExact) {
  const int64_t n = 100003;
  const auto a = random_floats(n, 3), b = random_floats(n, 4);
  DeviceBuffer<float> da(a), db(b), out(n);
  kernels::add(da.get(), db.get(), out.get(), n, stream_);
  const auto sum = out.host();
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(sum[i], a[i] + b[i]) << i;

  DeviceBuffer<int> flag(std::vector<int>{0});
  kernels::scale_and_check(out.get(), n, 0.5f, flag.get(), stream_);
  const auto half = out.host();
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(half[i], sum[i] * 0.5f) << i;
  EXPECT_EQ(flag.host()[0], 0);
  // Values up to 1 times 1e38 stay finite; the same again overflows: an fp16 step to skip.
  kernels::scale_and_check(out.get(), n, 1e38f, flag.get(), stream_);
  EXPECT_EQ(flag.host()[0], 0);
  kernels::scale_and_check(out.get(), n, 1e38f, flag.get(), stream_);
  EXPECT_EQ(flag.host()[0], 1);
}

// ---- the kernels of mixed precision: convert, scale, and relu and add on 16-bit activations ----
// References: testing::round_to, the CPU's rounding to nearest even (proven in compare_test).

using testing::Precision;

DType dtype_of(Precision p) { return p == Precision::Bf16 ? DType::BF16 : p == Precision::Fp16 ? DType::F16 : DType::F32; }

// The 16 bits of a bf16 or fp16 value (x already representable) and back.
uint16_t bits16(Precision p, float x) {
  if (p == Precision::Fp16) return testing::fp16_bits(x);
  uint32_t f;
  std::memcpy(&f, &x, sizeof f);
  return static_cast<uint16_t>(f >> 16);  // x is a bf16 value: its low half is zero
}
float from_bits16(Precision p, uint16_t b) {
  if (p == Precision::Fp16) return testing::fp16_value(b);
  const uint32_t f = static_cast<uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &f, sizeof x);
  return x;
}

// A device array of n values of precision p holding `values` (rounded to p), read back as floats.
class TypedBuffer {
 public:
  TypedBuffer(Precision p, const std::vector<float>& values) : p_(p), n_(values.size()) {
    std::vector<uint8_t> raw(bytes());
    for (size_t i = 0; i < n_; ++i) {
      const float v = testing::round_to(p, values[i]);
      if (p == Precision::Fp32) std::memcpy(raw.data() + 4 * i, &v, 4);
      else {
        const uint16_t b = bits16(p, v);
        std::memcpy(raw.data() + 2 * i, &b, 2);
      }
    }
    p_dev_ = device::allocate(bytes());
    device::copy(p_dev_, raw.data(), bytes(), device::Copy::HostToDevice);
  }
  ~TypedBuffer() { device::release(p_dev_); }
  TypedBuffer(const TypedBuffer&) = delete;
  TypedBuffer& operator=(const TypedBuffer&) = delete;
  void* get() const { return p_dev_; }
  std::vector<float> host() const {
    std::vector<uint8_t> raw(bytes());
    device::copy(raw.data(), p_dev_, bytes(), device::Copy::DeviceToHost);
    std::vector<float> out(n_);
    for (size_t i = 0; i < n_; ++i) {
      if (p_ == Precision::Fp32) std::memcpy(&out[i], raw.data() + 4 * i, 4);
      else {
        uint16_t b;
        std::memcpy(&b, raw.data() + 2 * i, 2);
        out[i] = from_bits16(p_, b);
      }
    }
    return out;
  }

 private:
  size_t bytes() const { return n_ * (p_ == Precision::Fp32 ? 4 : 2); }
  Precision p_;
  size_t n_;
  void* p_dev_ = nullptr;
};

// Equal as values, NaN equal to NaN, and +0 told from -0.
::testing::AssertionResult same_values(const std::vector<float>& got, const std::vector<float>& want) {
  for (size_t i = 0; i < want.size(); ++i)
    if (!(std::isnan(got[i]) && std::isnan(want[i])) && !same_bits(got[i], want[i]))
      return ::testing::AssertionFailure() << "[" << i << "]: got " << got[i] << ", want " << want[i];
  return ::testing::AssertionSuccess();
}

const Precision kStored[] = {Precision::Fp32, Precision::Bf16, Precision::Fp16};

// convert: every pair of element types, with a factor (a loss scale divided out), equals the
// CPU's float product rounded once to the target; the non-finite flag is raised by exactly
// the conversions that overflow. 70,001 values go one a thread, 70,000 four a thread; 70,000
// read or written one element past a 16-byte boundary, one a thread (the emulation fails a
// misaligned access, as a GPU does), and the element in front is left as it was.
TEST_F(GpuKernels, ConvertBetweenEveryPairEqualsTheCpuRounding) {
  struct Case {
    size_t count, in_offset, out_offset;
  };
  for (const Case k : {Case{70001, 0, 0}, Case{70000, 0, 0}, Case{70000, 1, 0}, Case{70000, 0, 1}}) {
    for (Precision from : kStored)
      for (Precision to : kStored)
        for (float factor : {1.f, 1.f / 1024.f, 300.f}) {
          auto values = random_floats(k.count, 11, 300.f);
          values[0] = 0.f, values[1] = -0.f, values[2] = 65504.f, values[3] = 1e-6f;
          SCOPED_TRACE(::testing::Message() << k.count << " values (offsets " << k.in_offset << ", " << k.out_offset
                                            << "), " << testing::name_of(from) << " -> " << testing::name_of(to)
                                            << " x " << factor);
          std::vector<float> in_values(k.in_offset, 5.f);
          in_values.insert(in_values.end(), values.begin(), values.end());
          TypedBuffer in(from, in_values), out(to, std::vector<float>(k.out_offset + values.size(), -3.f));
          const void* in_at = static_cast<const char*>(in.get()) + k.in_offset * dtype_size(dtype_of(from));
          void* out_at = static_cast<char*>(out.get()) + k.out_offset * dtype_size(dtype_of(to));
          DeviceBuffer<int> flag(std::vector<int>{0});
          kernels::convert(dtype_of(from), in_at, dtype_of(to), out_at, static_cast<int64_t>(values.size()), factor,
                           flag.get(), stream_);
          std::vector<float> want(k.out_offset, -3.f);
          bool overflow = false;
          for (size_t i = 0; i < values.size(); ++i) {
            want.push_back(testing::round_to(to, testing::round_to(from, values[i]) * factor));
            overflow |= !std::isfinite(want.back());
          }
          EXPECT_TRUE(same_values(out.host(), want));
          EXPECT_EQ(flag.host()[0], overflow ? 1 : 0);
        }
  }
}

// convert_spans: spans of a 16-bit arena (bf16 and fp16; fp32 too) converted into an fp32 arena
// of the same layout, the factor applied, equal the CPU's product rounded once, and nothing
// outside the spans is written. 80 spans, 71 of them not empty (the empty ones are left out of
// the launches' lists), so two launches (kernels::kMaxConvertSpans = 64): empty ones, one of a
// single element, odd offsets, adjacent ones, in backward order (the last slot first, as a
// backward pass defers its layers' gradients).
TEST_F(GpuKernels, ConvertSpansEqualTheCpuRoundingAndWriteNothingElse) {
  const auto values = random_floats(300007, 12, 300.f);  // 80 spans of under 4,050 elements with their gaps fit
  std::vector<kernels::Span> spans;
  std::mt19937 g(5);
  for (int64_t at = 7; spans.size() < 80;) {
    const int64_t count = spans.size() % 9 == 3 ? 0 : spans.size() % 9 == 5 ? 1 : static_cast<int64_t>(g() % 4000);
    spans.push_back({at, count});
    at += count + (spans.size() % 4 == 0 ? 0 : static_cast<int64_t>(g() % 50) + 1);
  }
  ASSERT_LT(spans.back().offset + spans.back().count, static_cast<int64_t>(values.size()));
  ASSERT_GT(std::count_if(spans.begin(), spans.end(), [](const kernels::Span& s) { return s.count > 0; }),
            kernels::kMaxConvertSpans)
      << "more spans that hold elements than one launch takes: the second launch is tested too";
  std::reverse(spans.begin(), spans.end());
  const float untouched = -7.25f, factor = 1.f / 1024.f;
  for (Precision from : kStored) {
    SCOPED_TRACE(testing::name_of(from));
    TypedBuffer in(from, values), out(Precision::Fp32, std::vector<float>(values.size(), untouched));
    kernels::convert_spans(dtype_of(from), in.get(), static_cast<float*>(out.get()), spans, factor, stream_);
    std::vector<float> want(values.size(), untouched);
    for (const auto& s : spans)
      for (int64_t i = s.offset; i < s.offset + s.count; ++i) {
        const auto k = static_cast<size_t>(i);
        want[k] = testing::round_to(Precision::Fp32, testing::round_to(from, values[k]) * factor);
      }
    EXPECT_TRUE(same_values(out.host(), want));
  }
}

// count_correct against the CPU's argmax count (the first largest entry, ties included),
// added to what the counter held.
TEST_F(GpuKernels, CountCorrectEqualsTheCpuArgmaxCount) {
  const int64_t n = 1000, k = 10;
  auto scores = random_floats(static_cast<size_t>(n * k), 16);
  std::vector<int32_t> labels(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) {
    labels[static_cast<size_t>(r)] = static_cast<int32_t>((r * 3) % k);
    if (r % 5 == 0) scores[static_cast<size_t>(r * k + (r * 3) % k)] = 9.f;  // right
    if (r % 10 == 0) scores[static_cast<size_t>(r * k + 9)] = 9.f;           // a tie: the first wins
  }
  int expected = 0;
  for (int64_t r = 0; r < n; ++r) {
    const float* row = scores.data() + r * k;
    expected += std::max_element(row, row + k) - row == labels[static_cast<size_t>(r)];
  }
  DeviceBuffer<float> ds(scores);
  DeviceBuffer<int32_t> dl(labels);
  DeviceBuffer<int> correct(std::vector<int>{5});
  kernels::count_correct(ds.get(), dl.get(), n, k, correct.get(), stream_);
  EXPECT_EQ(correct.host()[0], 5 + expected);
}

// relu and add on bf16 and fp16 activations: computed in float, rounded once when stored.
TEST_F(GpuKernels, SixteenBitReluAndAddEqualTheCpuRounding) {
  const int64_t n = 50021;
  auto a = random_floats(n, 13, 4.f), b = random_floats(n, 14, 4.f), dy = random_floats(n, 15);
  a[0] = 0.f, a[1] = -0.f, b[2] = -a[2];
  for (Precision p : {Precision::Bf16, Precision::Fp16, Precision::Fp32}) {
    SCOPED_TRACE(testing::name_of(p));
    const DType t = dtype_of(p);
    TypedBuffer da(p, a), db(p, b), ddy(p, dy), y(p, std::vector<float>(n)), dx(p, std::vector<float>(n)),
        sum(p, std::vector<float>(n));
    kernels::relu_forward(t, da.get(), y.get(), n, stream_);
    kernels::relu_backward(t, y.get(), ddy.get(), dx.get(), n, stream_);
    kernels::add(t, da.get(), db.get(), sum.get(), n, stream_);
    std::vector<float> want_y(n), want_dx(n), want_sum(n);
    for (int64_t i = 0; i < n; ++i) {
      const float ai = testing::round_to(p, a[i]), bi = testing::round_to(p, b[i]);
      want_y[i] = ai > 0.f ? ai : 0.f;
      want_dx[i] = want_y[i] > 0.f ? testing::round_to(p, dy[i]) : 0.f;
      want_sum[i] = testing::round_to(p, ai + bi);
    }
    EXPECT_TRUE(same_values(y.host(), want_y)) << "relu forward";
    EXPECT_TRUE(same_values(dx.host(), want_dx)) << "relu backward";
    EXPECT_TRUE(same_values(sum.host(), want_sum)) << "add";
  }
}

// count random h x w RGB images (bytes from seed), all of class 1, and a normalisation for them.
data::Dataset random_rgb_images(int64_t count, int64_t h, int64_t w, unsigned seed) {
  data::Dataset ds;
  ds.count = count, ds.height = h, ds.width = w, ds.channels = 3;
  std::mt19937 g(seed);
  ds.images.resize(static_cast<size_t>(ds.count * ds.sample_bytes()));
  for (auto& b : ds.images) b = static_cast<uint8_t>(g());
  ds.labels.assign(static_cast<size_t>(ds.count), 1);
  return ds;
}
const data::Normalization kRgbNorm{{0.49f, 0.48f, 0.45f}, {0.25f, 0.24f, 0.26f}};

// Every output of a batch norm's forward and backward in training, on the host.
struct BnOutputs {
  std::vector<float> y, dx, mean, invstd, running_mean, running_var, dgamma, dbeta;
};

// The same bits in every output (which differs first, if any).
::testing::AssertionResult same_outputs(const BnOutputs& got, const BnOutputs& want) {
  const std::pair<const char*, std::vector<float> BnOutputs::*> fields[] = {
      {"y", &BnOutputs::y},          {"dx", &BnOutputs::dx},
      {"mean", &BnOutputs::mean},    {"1/std", &BnOutputs::invstd},
      {"running mean", &BnOutputs::running_mean}, {"running variance", &BnOutputs::running_var},
      {"dgamma", &BnOutputs::dgamma}, {"dbeta", &BnOutputs::dbeta}};
  for (const auto& [name, field] : fields) {
    const std::vector<float>& a = got.*field;
    const std::vector<float>& b = want.*field;
    if (a.size() != b.size() || (!a.empty() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) != 0))
      return ::testing::AssertionFailure() << name << " differs";
  }
  return ::testing::AssertionSuccess();
}

// The CPU assembler's batch and the GPU's normalisation of the same bytes with its table.
// Batch norm in training (kernels/batch_norm.cu) against its definition in double: the
// saved statistics, the running averages, y with and without the fused ReLU, dgamma and dbeta
// (with a loss scale's factor), and dx. Shapes that leave partial slabs and a partial block of
// channels, and a channel mean of 5 standard deviations (the sums are centred). Two runs give
// the same bits, the second on the work area the first used; each fused-finalize choice gives
// its unfused twin's bits, every output.
TEST_F(GpuKernels, BatchNormTrainingEqualsItsDefinition) {
  struct Case {
    int64_t rows, channels;
    bool relu;
  };
  // (200 and 99 channels: several columns of channel blocks, each with the fused finalize's own
  // counters and first channel; 99 at one channel a thread.)
  const Case cases[] = {Case{1000, 40, false}, Case{1000, 40, true},   Case{3, 3, false},      Case{20000, 7, true},
                        Case{30000, 64, true},  Case{5000, 200, true}, Case{5000, 99, false}};
  for (size_t case_index = 0; case_index < std::size(cases); ++case_index) {
    const Case k = cases[case_index];
    SCOPED_TRACE(::testing::Message() << k.rows << " x " << k.channels << (k.relu ? " relu" : ""));
    const int64_t rows = k.rows, c = k.channels, n = rows * c;
    auto x = random_floats(static_cast<size_t>(n), 31);
    for (int64_t i = 0; i < n; ++i) x[i] += 5.0f * static_cast<float>(i % c % 3);
    const auto dy = random_floats(static_cast<size_t>(n), 32);
    const auto gamma = random_floats(static_cast<size_t>(c), 33), beta = random_floats(static_cast<size_t>(c), 34);
    std::vector<float> running_mean(static_cast<size_t>(c), 0.5f), running_var(static_cast<size_t>(c), 2.0f);
    const double momentum = 0.1, eps = 1e-5;
    const float factor = 1.0f / 1024;
    // The definition, in double.
    std::vector<double> mean(c, 0), var(c, 0), sdy(c, 0), sdyx(c, 0);
    for (int64_t i = 0; i < n; ++i) mean[i % c] += x[i] / static_cast<double>(rows);
    for (int64_t i = 0; i < n; ++i)
      var[i % c] += (x[i] - mean[i % c]) * (x[i] - mean[i % c]) / static_cast<double>(rows);
    std::vector<float> want_y(n), want_dx(n), want_dgamma(c), want_dbeta(c), want_rm(c), want_rv(c), want_inv(c);
    auto invstd = [&](int64_t ch) { return 1.0 / std::sqrt(var[ch] + eps); };
    for (int64_t i = 0; i < n; ++i) {
      const int64_t ch = i % c;
      const double xhat = (x[i] - mean[ch]) * invstd(ch), v = xhat * gamma[ch] + beta[ch];
      want_y[i] = static_cast<float>(k.relu && v < 0 ? 0.0 : v);
      sdy[ch] += dy[i];
      sdyx[ch] += dy[i] * xhat;
    }
    for (int64_t ch = 0; ch < c; ++ch) {
      want_dgamma[ch] = static_cast<float>(factor * sdyx[ch]);
      want_dbeta[ch] = static_cast<float>(factor * sdy[ch]);
      want_rm[ch] = static_cast<float>(0.9 * 0.5 + 0.1 * mean[ch]);
      want_rv[ch] = static_cast<float>(0.9 * 2.0 + 0.1 * var[ch] * rows / (rows - 1));
      want_inv[ch] = static_cast<float>(invstd(ch));
    }
    for (int64_t i = 0; i < n; ++i) {
      const int64_t ch = i % c;
      const double xhat = (x[i] - mean[ch]) * invstd(ch);
      want_dx[i] = static_cast<float>(gamma[ch] * invstd(ch) *
                                      (dy[i] - sdy[ch] / rows - xhat * sdyx[ch] / static_cast<double>(rows)));
    }
    // One forward and backward on fresh vectors and the given work area; every output, on the host.
    auto run = [&](DeviceBuffer<double>& work) {
      DeviceBuffer<float> dxin(x), ddy(dy), dg(gamma), db(beta), drm(running_mean), drv(running_var);
      DeviceBuffer<float> y(static_cast<size_t>(n)), dxo(static_cast<size_t>(n)), sm(static_cast<size_t>(c)),
          si(static_cast<size_t>(c)), dgamma(static_cast<size_t>(c)), dbeta(static_cast<size_t>(c));
      kernels::batch_norm_forward_train(DType::F32, dxin.get(), y.get(), rows, c, dg.get(), db.get(), drm.get(),
                                        drv.get(), momentum, eps, k.relu, sm.get(), si.get(), work.get(), stream_);
      kernels::batch_norm_backward(DType::F32, dxin.get(), ddy.get(), dxo.get(), rows, c, dg.get(), sm.get(),
                                   si.get(), factor, dgamma.get(), dbeta.get(), work.get(), stream_);
      return BnOutputs{y.host(), dxo.host(), sm.host(), si.host(), drm.host(), drv.host(), dgamma.host(), dbeta.host()};
    };
    std::map<std::string, BnOutputs> unfused;  // each unfused choice's, for its fused twin
    for (const kernels::BatchNormTuning& tuning : tunings_for(case_index, std::size(cases))) {
      SCOPED_TRACE("tuning " + kernels::batch_norm_tuning_text(tuning));
      kernels::set_batch_norm_tuning(tuning);
      // One work area for both runs: the second finds the fused finalize's counters as the first left them.
      DeviceBuffer<double> work((kernels::batch_norm_work_bytes(DType::F32, rows, c) + 7) / 8);
      BnOutputs first;
      for (int run_index = 0; run_index < 2; ++run_index) {
        const BnOutputs o = run(work);
        EXPECT_TRUE(testing::matches(o.y, want_y, testing::Precision::Fp32, 2)) << "y";
        EXPECT_TRUE(testing::matches(o.invstd, want_inv, testing::Precision::Fp32, 2)) << "1/std";
        EXPECT_TRUE(testing::matches(o.running_mean, want_rm, testing::Precision::Fp32, 2)) << "running mean";
        EXPECT_TRUE(testing::matches(o.running_var, want_rv, testing::Precision::Fp32, 2)) << "running variance";
        EXPECT_TRUE(testing::matches(o.dgamma, want_dgamma, testing::Precision::Fp32, 4)) << "dgamma";
        EXPECT_TRUE(testing::matches(o.dbeta, want_dbeta, testing::Precision::Fp32, 4)) << "dbeta";
        EXPECT_TRUE(testing::matches(o.dx, want_dx, testing::Precision::Fp32, 4)) << "dx";
        if (run_index == 0) first = o;
        else EXPECT_TRUE(same_outputs(o, first)) << "a second run repeats every bit";
      }
      kernels::BatchNormTuning twin = tuning;
      twin.fused_finalize = false;
      if (!tuning.fused_finalize) {
        unfused[kernels::batch_norm_tuning_text(tuning)] = first;
        continue;
      }
      const auto it = unfused.find(kernels::batch_norm_tuning_text(twin));
      ASSERT_NE(it, unfused.end()) << "the unfused twin runs first";
      EXPECT_TRUE(same_outputs(first, it->second)) << "the fused finalize gives the unfused one's bits";
    }
  }
}

// The passes' 8- or 16-byte loads are taken only where every pointer of the call is on that
// boundary: x, y, dy and dx each in turn one element off (the element in front left as it was)
// give, through the default launch and its fused twin, what the aligned call gives, within
// rounding (the slabs follow the width: not the same bits). dy or dx off the boundary has the
// backward at one channel a thread after a forward at the full width: it reads the forward's
// coefficients where that one wrote them. The emulation fails a misaligned access.
TEST_F(GpuKernels, BatchNormOffTheBoundaryIsOneChannelAThread) {
  const int64_t rows = 1000, c = 40, n = rows * c;
  auto x = random_floats(static_cast<size_t>(n), 35);
  for (int64_t i = 0; i < n; ++i) x[i] += 5.0f * static_cast<float>(i % c % 3);
  const auto dy = random_floats(static_cast<size_t>(n), 36);
  const auto gamma = random_floats(static_cast<size_t>(c), 37), beta = random_floats(static_cast<size_t>(c), 38);
  const std::vector<float> running_mean(static_cast<size_t>(c), 0.5f), running_var(static_cast<size_t>(c), 2.0f);
  const float factor = 1.0f / 1024;
  const char* names[] = {"none", "x", "y", "dy", "dx"};
  // shifted: 0 none, else which of x, y, dy, dx is one element off.
  auto run = [&](int shifted) {
    auto front = [&](const std::vector<float>& v, int which) {
      std::vector<float> out(shifted == which ? 1 : 0, 9.f);
      out.insert(out.end(), v.begin(), v.end());
      return out;
    };
    const std::vector<float> zeros(static_cast<size_t>(n), 0.f);
    DeviceBuffer<float> dxin(front(x, 1)), dyv(front(zeros, 2)), ddy(front(dy, 3)), dxo(front(zeros, 4));
    DeviceBuffer<float> dg(gamma), db(beta), drm(running_mean), drv(running_var), sm(static_cast<size_t>(c)),
        si(static_cast<size_t>(c)), dgamma(static_cast<size_t>(c)), dbeta(static_cast<size_t>(c));
    DeviceBuffer<double> work((kernels::batch_norm_work_bytes(DType::F32, rows, c) + 7) / 8);
    auto at = [&](const DeviceBuffer<float>& b, int which) { return b.get() + (shifted == which ? 1 : 0); };
    kernels::batch_norm_forward_train(DType::F32, at(dxin, 1), at(dyv, 2), rows, c, dg.get(), db.get(), drm.get(),
                                      drv.get(), 0.1, 1e-5, true, sm.get(), si.get(), work.get(), stream_);
    kernels::batch_norm_backward(DType::F32, at(dxin, 1), at(ddy, 3), at(dxo, 4), rows, c, dg.get(), sm.get(),
                                 si.get(), factor, dgamma.get(), dbeta.get(), work.get(), stream_, true);
    auto back = [&](const DeviceBuffer<float>& b, int which) {
      auto h = b.host();
      if (shifted == which) {
        EXPECT_EQ(h.front(), 9.f) << "the element in front of " << names[which];
        h.erase(h.begin());
      }
      return h;
    };
    return BnOutputs{back(dyv, 2), back(dxo, 4), sm.host(), si.host(), drm.host(), drv.host(), dgamma.host(),
                     dbeta.host()};
  };
  kernels::BatchNormTuning tuning = kernels::batch_norm_tuning();
  for (bool fused : {false, true}) {
    tuning.fused_finalize = fused;
    kernels::set_batch_norm_tuning(tuning);
    const BnOutputs want = run(0);
    for (int shifted = 1; shifted <= 4; ++shifted) {
      SCOPED_TRACE(::testing::Message() << "tuning " << kernels::batch_norm_tuning_text(tuning) << ", "
                                        << names[shifted] << " one element off the boundary");
      const BnOutputs o = run(shifted);
      EXPECT_TRUE(testing::matches(o.y, want.y, testing::Precision::Fp32, 4)) << "y";
      EXPECT_TRUE(testing::matches(o.mean, want.mean, testing::Precision::Fp32, 4)) << "mean";
      EXPECT_TRUE(testing::matches(o.invstd, want.invstd, testing::Precision::Fp32, 4)) << "1/std";
      EXPECT_TRUE(testing::matches(o.running_mean, want.running_mean, testing::Precision::Fp32, 4)) << "running mean";
      EXPECT_TRUE(testing::matches(o.running_var, want.running_var, testing::Precision::Fp32, 4)) << "running var";
      EXPECT_TRUE(testing::matches(o.dgamma, want.dgamma, testing::Precision::Fp32, 8)) << "dgamma";
      EXPECT_TRUE(testing::matches(o.dbeta, want.dbeta, testing::Precision::Fp32, 8)) << "dbeta";
      EXPECT_TRUE(testing::matches(o.dx, want.dx, testing::Precision::Fp32, 8)) << "dx";
    }
  }
}

// The batch-norm passes' launch choices as gpu_step --bn-tuning reads them: every choice's
// text reads back as itself, the default first, each fused-finalize choice after its unfused
// twin; the texts of before the sixth field read as they did (unfused); a value the kernels
// have no launch for is a usage error naming it. (No GPU needed.)
TEST(BatchNormTuning, TextReadsBackAndOtherValuesAreRefused) {
  const auto all = kernels::batch_norm_tunings();
  ASSERT_EQ(all.size(), 96u);
  EXPECT_EQ(kernels::batch_norm_tuning_text(all.front()), kernels::batch_norm_tuning_text({}));
  std::set<std::string> seen;
  for (const auto& t : all) {
    const std::string text = kernels::batch_norm_tuning_text(t);
    const kernels::BatchNormTuning back = kernels::parse_batch_norm_tuning(text);
    EXPECT_EQ(kernels::batch_norm_tuning_text(back), text);
    EXPECT_EQ(back.fused_finalize, t.fused_finalize) << text;
    kernels::BatchNormTuning twin = t;
    twin.fused_finalize = false;
    EXPECT_TRUE(!t.fused_finalize || seen.count(kernels::batch_norm_tuning_text(twin))) << text << " before its twin";
    EXPECT_TRUE(seen.insert(text).second) << text << " twice";
  }
  EXPECT_EQ(std::count_if(all.begin(), all.end(), [](const auto& t) { return t.fused_finalize; }), 48);
  EXPECT_EQ(kernels::batch_norm_tuning_text(kernels::parse_batch_norm_tuning("16,2,4,0")), "16,2,4,0,1024")
      << "the sum blocks left out are the default's";
  EXPECT_FALSE(kernels::parse_batch_norm_tuning("8,4,2,1,1024").fused_finalize) << "five fields: unfused";
  EXPECT_FALSE(kernels::parse_batch_norm_tuning("8,4,2,1,1024,0").fused_finalize);
  EXPECT_EQ(kernels::batch_norm_tuning_text(kernels::parse_batch_norm_tuning("8,4,2,1,1024,0")), "8,4,2,1,1024")
      << "unfused choices keep their five-field names";
  EXPECT_TRUE(kernels::parse_batch_norm_tuning("16,2,4,0,256,1").fused_finalize);
  EXPECT_EQ(kernels::batch_norm_tuning_text(kernels::parse_batch_norm_tuning("16,2,4,0,256,1")), "16,2,4,0,256,1");
  for (const char* bad : {"12,2,4,0", "16,3,4,0", "16,2,3,0", "16,2,4,2", "16,2,4", "16,2,4,0x", "fast",
                          "16,2,4,0,300", "16,2,4,0,", ",16,2,4,0", "16,2,4,0,512,2", "16,2,4,0,512,1,0",
                          "16,2,4,0,,1", "16,2,4,0,512,", "16,,4,0", "16,2,-4,0", "12,2,4,0,512,1",
                          "16,3,4,0,512,0", "012,2,4,0"}) {  // (the last two: named as written, not as rebuilt)
    try {
      kernels::parse_batch_norm_tuning(bad);
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Usage) << bad;
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
  const std::string before = kernels::batch_norm_tuning_text(kernels::batch_norm_tuning());
  EXPECT_THROW(kernels::set_batch_norm_tuning({16, 2, 3, false}), Error);
  EXPECT_EQ(kernels::batch_norm_tuning_text(kernels::batch_norm_tuning()), before) << "a refused value is not kept";
}

// The fused finalize in a captured CUDA graph: its counters, set back to zero by the kernels
// themselves, let every replay finish the channels, with the bits of the unfused launches
// called directly (running averages aside: each replay moves them again).
TEST_F(GpuKernels, BatchNormFusedFinalizeReplaysInAGraph) {
  const int64_t rows = 5000, c = 96, n = rows * c;
  const auto x = random_floats(static_cast<size_t>(n), 51), dy = random_floats(static_cast<size_t>(n), 52);
  const auto gamma = random_floats(static_cast<size_t>(c), 53), beta = random_floats(static_cast<size_t>(c), 54);
  DeviceBuffer<float> dxin(x), ddy(dy), dg(gamma), db(beta), rm(static_cast<size_t>(c)), rv(static_cast<size_t>(c));
  DeviceBuffer<float> y(static_cast<size_t>(n)), dxo(static_cast<size_t>(n)), sm(static_cast<size_t>(c)),
      si(static_cast<size_t>(c)), dgamma(static_cast<size_t>(c)), dbeta(static_cast<size_t>(c));
  DeviceBuffer<double> work((kernels::batch_norm_work_bytes(DType::F32, rows, c) + 7) / 8);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  auto step = [&] {
    kernels::batch_norm_forward_train(DType::F32, dxin.get(), y.get(), rows, c, dg.get(), db.get(), rm.get(),
                                      rv.get(), 0.1, 1e-5, true, sm.get(), si.get(), work.get(), stream);
    kernels::batch_norm_backward(DType::F32, dxin.get(), ddy.get(), dxo.get(), rows, c, dg.get(), sm.get(), si.get(),
                                 0.5f, dgamma.get(), dbeta.get(), work.get(), stream, true);
  };
  auto outputs = [&] {
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    return BnOutputs{y.host(), dxo.host(), sm.host(), si.host(), {}, {}, dgamma.host(), dbeta.host()};
  };
  kernels::BatchNormTuning tuning = kernels::batch_norm_tuning();
  tuning.fused_finalize = false;
  kernels::set_batch_norm_tuning(tuning);
  step();
  const BnOutputs want = outputs();
  tuning.fused_finalize = true;
  kernels::set_batch_norm_tuning(tuning);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  step();
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 3; ++replay) {
    SCOPED_TRACE(::testing::Message() << "replay " << replay);
    // The outputs overwritten first (all bits set: NaNs), outside the graph: a replay that left
    // any of them alone (a finish its last blocks never ran) cannot match by keeping the eager
    // step's values.
    for (auto [p, count] : {std::pair<float*, int64_t>{y.get(), n}, {dxo.get(), n}, {sm.get(), c}, {si.get(), c},
                            {dgamma.get(), c}, {dbeta.get(), c}})
      ASSERT_EQ(cudaMemsetAsync(p, 0xFF, static_cast<size_t>(count) * sizeof(float), stream), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    EXPECT_TRUE(same_outputs(outputs(), want));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// The fusions of kernels/batch_norm.cu against the separate passes they replace, on the GPU,
// bit for bit, in every stored type and at both vector widths (channels that 16 bytes of the
// type divide, and channels that they do not): the forward with a residual join and its ReLU
// equals bn, then add, then ReLU; the backward with the ReLU mask recomputed from x equals
// relu_backward on the stored output, then the backward without a mask (dx, dgamma, dbeta).
// A dropped mask, a wrong residual or a mask off by one rounding differs somewhere in these
// batches (a third of the values are masked, some within rounding of zero). And each
// fused-finalize choice gives its unfused twin's bits in every output of both fusions, in every
// stored type (BatchNormTrainingEqualsItsDefinition checks the twins in fp32 without the fusions).
TEST_F(GpuKernels, BatchNormFusionsEqualTheSeparatePasses) {
  struct Case {
    int64_t rows, channels;
  };
  const Case cases[] = {Case{1000, 64}, Case{777, 24}, Case{300, 12}, Case{50, 3}, Case{4096, 256}};
  size_t case_index = 0;  // of the precision and shape: which launch choices run emulated
  for (const Precision prec : kStored) {
    const DType t = dtype_of(prec);
    for (const Case k : cases) {
      const std::vector<kernels::BatchNormTuning> tunings = tunings_for(case_index++, std::size(kStored) * std::size(cases));
      SCOPED_TRACE(::testing::Message() << testing::name_of(prec) << " " << k.rows << " x " << k.channels);
      const int64_t rows = k.rows, c = k.channels;
      const auto n = static_cast<size_t>(rows * c);
      auto x = random_floats(n, 41);
      for (size_t i = 0; i < n; ++i) x[i] += 0.5f * static_cast<float>(i % static_cast<size_t>(c) % 3);
      for (size_t i = 0; i < n; i += 97) x[i] = 0.f;  // values the affine map sends near zero
      const auto dy = random_floats(n, 42), res = random_floats(n, 43);
      const auto gamma = random_floats(static_cast<size_t>(c), 44), beta = random_floats(static_cast<size_t>(c), 45);
      TypedBuffer dx_in(prec, x), ddy(prec, dy), dres(prec, res);
      DeviceBuffer<float> dg(gamma), db(beta);
      const size_t work_doubles = (kernels::batch_norm_work_bytes(t, rows, c) + 7) / 8;
      // Each unfused choice's outputs, for its fused-finalize twin (listed after it).
      const char* const output_names[] = {"joined y", "mean", "1/std", "masked dx", "masked dgamma", "masked dbeta"};
      std::map<std::string, std::vector<std::vector<float>>> unfused;
      for (const kernels::BatchNormTuning& tuning : tunings) {
        SCOPED_TRACE("tuning " + kernels::batch_norm_tuning_text(tuning));
        kernels::set_batch_norm_tuning(tuning);
        std::vector<std::vector<float>> outputs;  // as output_names
        auto forward = [&](bool relu, const void* residual, void* y, DeviceBuffer<double>& work) {
          DeviceBuffer<float> rm(std::vector<float>(static_cast<size_t>(c), 0.f));
          DeviceBuffer<float> rv(std::vector<float>(static_cast<size_t>(c), 1.f));
          DeviceBuffer<float> sm(static_cast<size_t>(c)), si(static_cast<size_t>(c));
          kernels::batch_norm_forward_train(t, dx_in.get(), y, rows, c, dg.get(), db.get(), rm.get(), rv.get(), 0.1,
                                            1e-5, relu, sm.get(), si.get(), work.get(), stream_, residual);
          return std::make_pair(sm.host(), si.host());
        };
        // Forward: joined and fused, against bn, add, ReLU.
        {
          DeviceBuffer<double> w1(work_doubles), w2(work_doubles);
          TypedBuffer fused(prec, std::vector<float>(n)), plain(prec, std::vector<float>(n));
          auto [fused_mean, fused_invstd] = forward(true, dres.get(), fused.get(), w1);
          forward(false, nullptr, plain.get(), w2);
          kernels::add(t, plain.get(), dres.get(), plain.get(), rows * c, stream_);
          kernels::relu_forward(t, plain.get(), plain.get(), rows * c, stream_);
          EXPECT_TRUE(same_values(fused.host(), plain.host())) << "relu(bn(x) + residual)";
          outputs = {fused.host(), std::move(fused_mean), std::move(fused_invstd)};
        }
        // Backward: the mask recomputed from x, against relu_backward on the stored output.
        {
          DeviceBuffer<double> work(work_doubles);
          TypedBuffer y(prec, std::vector<float>(n));
          const auto [sm_host, si_host] = forward(true, nullptr, y.get(), work);
          DeviceBuffer<float> sm(sm_host), si(si_host);
          TypedBuffer dx1(prec, std::vector<float>(n)), dx2(prec, std::vector<float>(n));
          TypedBuffer masked(prec, std::vector<float>(n));
          DeviceBuffer<float> dgamma1(static_cast<size_t>(c)), dbeta1(static_cast<size_t>(c));
          DeviceBuffer<float> dgamma2(static_cast<size_t>(c)), dbeta2(static_cast<size_t>(c));
          kernels::batch_norm_backward(t, dx_in.get(), ddy.get(), dx1.get(), rows, c, dg.get(), sm.get(), si.get(),
                                       0.5f, dgamma1.get(), dbeta1.get(), work.get(), stream_, true);
          kernels::relu_backward(t, y.get(), ddy.get(), masked.get(), rows * c, stream_);
          kernels::batch_norm_backward(t, dx_in.get(), masked.get(), dx2.get(), rows, c, dg.get(), sm.get(), si.get(),
                                       0.5f, dgamma2.get(), dbeta2.get(), work.get(), stream_, false);
          const auto yh = y.host();
          const auto zeros = std::count(yh.begin(), yh.end(), 0.f);
          EXPECT_GT(zeros, static_cast<long>(n / 5)) << "the ReLU masks a good part of the batch";
          EXPECT_TRUE(same_values(dx1.host(), dx2.host())) << "dx";
          EXPECT_TRUE(same_values(dgamma1.host(), dgamma2.host())) << "dgamma";
          EXPECT_TRUE(same_values(dbeta1.host(), dbeta2.host())) << "dbeta";
          outputs.push_back(dx1.host());
          outputs.push_back(dgamma1.host());
          outputs.push_back(dbeta1.host());
        }
        kernels::BatchNormTuning twin = tuning;
        twin.fused_finalize = false;
        if (!tuning.fused_finalize) {
          unfused[kernels::batch_norm_tuning_text(tuning)] = std::move(outputs);
          continue;
        }
        const auto it = unfused.find(kernels::batch_norm_tuning_text(twin));
        ASSERT_NE(it, unfused.end()) << "the unfused twin runs first";
        for (size_t i = 0; i < outputs.size(); ++i)
          EXPECT_TRUE(same_values(outputs[i], it->second[i])) << output_names[i] << ": the fused finalize's bits";
      }
    }
  }
}

TEST_F(GpuKernels, NormalisationEqualsTheCpuAssembler) {
  const data::Dataset ds = random_rgb_images(20, 8, 8, 5);
  data::BatchAssembler assembler(ds, kRgbNorm, {}, 1);
  std::vector<uint32_t> all(static_cast<size_t>(ds.count));
  for (uint32_t i = 0; i < all.size(); ++i) all[i] = i;
  data::Batch batch;
  assembler.assemble(all, 0, false, batch);
  const auto cpu = host_of(batch.images);
  DeviceBuffer<uint8_t> bytes(ds.images);
  DeviceBuffer<float> table(assembler.table()), out(ds.images.size());
  kernels::normalize_u8(bytes.get(), out.get(), static_cast<int64_t>(ds.images.size()), 3, table.get(), stream_);
  const auto gpu = out.host();
  ASSERT_EQ(gpu.size(), cpu.size());
  for (size_t i = 0; i < gpu.size(); ++i) ASSERT_TRUE(same_bits(gpu[i], cpu[i])) << i;
}

// GPU augmentation: the assembler's batch of bytes with its crops and flips, cropped and
// normalised by the GPU, is the CPU assembler's augmented float batch, bit for bit.
TEST_F(GpuKernels, CropFlipNormalisationEqualsTheCpuAssembler) {
  const data::Dataset ds = random_rgb_images(40, 9, 7, 8);
  data::BatchAssembler floats(ds, kRgbNorm, {3, true}, 21), bytes(ds, kRgbNorm, {3, true}, 21, 1, true);
  std::vector<uint32_t> idx(static_cast<size_t>(ds.count));
  for (uint32_t i = 0; i < idx.size(); ++i) idx[i] = (i * 7) % static_cast<uint32_t>(ds.count);
  data::Batch f, b;
  floats.assemble(idx, 4, true, f);
  bytes.assemble(idx, 4, true, b);
  ASSERT_EQ(b.crops.size(), idx.size());
  const auto cpu = host_of(f.images);
  const uint8_t* raw = b.images.data<uint8_t>();
  DeviceBuffer<uint8_t> in(std::vector<uint8_t>(raw, raw + b.images.numel()));
  const auto* cf = reinterpret_cast<const int32_t*>(b.crops.data());
  DeviceBuffer<int32_t> crops(std::vector<int32_t>(cf, cf + 3 * b.crops.size()));
  DeviceBuffer<float> table(bytes.table()), out(cpu.size());
  kernels::crop_flip_normalize_u8(in.get(), crops.get(), out.get(), ds.count, ds.height, ds.width, 3, table.get(),
                                  stream_);
  const auto gpu = out.host();
  for (size_t i = 0; i < gpu.size(); ++i) ASSERT_TRUE(same_bits(gpu[i], cpu[i])) << i;
}

void expect_softmax_xent_parity(int64_t n, int64_t k, double smoothing, cudaStream_t stream) {
  SCOPED_TRACE(::testing::Message() << n << " x " << k << ", smoothing " << smoothing);
  const auto z = random_floats(static_cast<size_t>(n * k), 6, 3.f);
  std::vector<int32_t> labels(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) labels[static_cast<size_t>(r)] = static_cast<int32_t>((r * 7) % k);
  nn::SoftmaxCrossEntropy<float> cpu(smoothing);
  const double loss_cpu = cpu.forward(tensor_of(z, {n, k}), labels.data());
  const auto p_cpu = host_of(cpu.probabilities());
  const auto d_cpu = host_of(cpu.backward());
  DeviceBuffer<float> dz(z), p(static_cast<size_t>(n * k)), d(static_cast<size_t>(n * k)), rows(static_cast<size_t>(n));
  DeviceBuffer<int32_t> dl(labels);
  DeviceBuffer<double> total(1);
  kernels::softmax_xent(dz.get(), dl.get(), n, k, static_cast<float>(smoothing), p.get(), d.get(), rows.get(), stream);
  kernels::sum_deterministic(rows.get(), n, total.get(), stream);
  const auto p_gpu = p.host(), d_gpu = d.host();
  for (size_t i = 0; i < p_gpu.size(); ++i) {
    ASSERT_NEAR(p_gpu[i], p_cpu[i], 1e-6f * std::max(1.f, std::fabs(p_cpu[i]))) << i;
    ASSERT_NEAR(d_gpu[i], d_cpu[i], 1e-6f / static_cast<float>(n) + 1e-6f * std::fabs(d_cpu[i])) << i;
  }
  EXPECT_NEAR(total.host()[0] / static_cast<double>(n), loss_cpu, 1e-6 * std::max(1.0, loss_cpu));
}

TEST_F(GpuKernels, SoftmaxCrossEntropyMatchesTheCpuLoss) {
  expect_softmax_xent_parity(67, 10, 0, stream_);
  expect_softmax_xent_parity(67, 10, 0.1, stream_);
  expect_softmax_xent_parity(33, 1000, 0.1, stream_);  // more classes than lanes
}

TEST_F(GpuKernels, ALabelOutOfRangeGivesANanLossAndNoGradient) {
  const std::vector<float> z{1, 2, 3, 4, 5, 6};
  DeviceBuffer<float> dz(z), p(6), d(6), rows(2);
  DeviceBuffer<int32_t> labels(std::vector<int32_t>{1, 3});  // 3 is outside [0, 3)
  kernels::softmax_xent(dz.get(), labels.get(), 2, 3, 0, p.get(), d.get(), rows.get(), stream_);
  const auto r = rows.host(), g = d.host();
  EXPECT_TRUE(std::isfinite(r[0]));
  EXPECT_TRUE(std::isnan(r[1]));
  for (int j = 3; j < 6; ++j) EXPECT_EQ(g[static_cast<size_t>(j)], 0.f);
}

TEST_F(GpuKernels, TheDeterministicSumIsReproducible) {
  const auto x = random_floats(1000003, 7);
  DeviceBuffer<float> dx(x);
  DeviceBuffer<double> a(1), b(1);
  kernels::sum_deterministic(dx.get(), static_cast<int64_t>(x.size()), a.get(), stream_);
  kernels::sum_deterministic(dx.get(), static_cast<int64_t>(x.size()), b.get(), stream_);
  double host = 0;
  for (float v : x) host += v;
  EXPECT_EQ(a.host()[0], b.host()[0]);
  EXPECT_NEAR(a.host()[0], host, 1e-9 * static_cast<double>(x.size()));
}

// One fused launch over the cnn's whole arena equals optim::Sgd's step bit for bit.
TEST_F(GpuKernels, SgdStepEqualsTheCpuOptimizerBitForBit) {
  for (bool nesterov : {true, false}) {
    SCOPED_TRACE(nesterov ? "nesterov" : "classical momentum");
    nn::Model<float> model(nn::ModelSpec{});
    model.init(1);
    ParamStore<float>& store = model.params();
    const int64_t n = store.values().numel();
    optim::Sgd<float> sgd(store, {0.9, nesterov, 5e-4, false});
    // Random gradients for the parameters; the arena's alignment padding keeps zero gradients,
    // as in training (the CPU step skips it, the GPU's walks it and must leave it zero).
    auto grads = random_floats(static_cast<size_t>(n), 8, 0.01f);
    std::vector<bool> in_range(static_cast<size_t>(n), false);
    for (const auto& r : sgd.ranges())
      for (int64_t i = r.begin; i < r.end; ++i) in_range[static_cast<size_t>(i)] = true;
    for (size_t i = 0; i < grads.size(); ++i)
      if (!in_range[i]) grads[i] = 0;
    std::memcpy(store.grads().data<float>(), grads.data(), grads.size() * sizeof(float));
    const std::vector<float> p0 = host_of(store.values());
    DeviceBuffer<float> p(p0), g(grads), v(static_cast<size_t>(n));
    std::vector<int64_t> ends;
    std::vector<float> decays;
    for (const auto& r : sgd.ranges()) {
      ends.push_back(r.end);
      decays.push_back(r.decay ? 5e-4f : 0.f);
    }
    DeviceBuffer<int64_t> dends(ends);
    DeviceBuffer<float> ddecays(decays);
    for (int step = 0; step < 3; ++step) {  // velocity carries over
      sgd.step(store, 0.05, 0.9);
      kernels::sgd_step(p.get(), g.get(), v.get(), n, dends.get(), ddecays.get(), static_cast<int>(ends.size()),
                        0.05f, 0.9f, nesterov, optim::sgd_fuses_multiply_add(), stream_);
    }
    const auto p_gpu = p.host(), v_gpu = v.host();
    const auto p_cpu = host_of(store.values()), v_cpu = host_of(sgd.momentum_buffer());
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_TRUE(same_bits(p_gpu[static_cast<size_t>(i)], p_cpu[static_cast<size_t>(i)])) << i;
      ASSERT_TRUE(same_bits(v_gpu[static_cast<size_t>(i)], v_cpu[static_cast<size_t>(i)])) << i;
    }
  }
}

// The update four elements a thread (128-bit loads: the arrays 16-byte aligned and n a multiple
// of 4) equals it one element a thread (the same arrays one float off that alignment) bit for
// bit, with ranges whose ends fall inside a pack of four (3, 10, 501: each element must take its
// own range's decay, not the pack's first element's).
TEST_F(GpuKernels, SgdStepFourAtATimeEqualsOneAtATime) {
  const int64_t n = 1000;
  const std::vector<int64_t> ends{3, 10, 501, 998, 1000};
  const std::vector<float> decays{0.5f, 0.f, 0.25f, 0.f, 0.125f};  // large: a wrong one shows
  DeviceBuffer<int64_t> dends(ends);
  DeviceBuffer<float> ddecays(decays);
  const auto p0 = random_floats(static_cast<size_t>(n), 21), g0 = random_floats(static_cast<size_t>(n), 22);
  auto shifted = [](const std::vector<float>& x) {  // one float in front: 4 bytes past the alignment
    std::vector<float> y(x.size() + 1, 0.f);
    std::copy(x.begin(), x.end(), y.begin() + 1);
    return y;
  };
  for (bool nesterov : {true, false}) {
    SCOPED_TRACE(nesterov ? "nesterov" : "classical momentum");
    DeviceBuffer<float> p(p0), g(g0), v(static_cast<size_t>(n)), p1(shifted(p0)), g1(shifted(g0)),
        v1(static_cast<size_t>(n + 1));
    for (const void* a : {static_cast<const void*>(p.get()), static_cast<const void*>(g.get()),
                          static_cast<const void*>(v.get())})
      ASSERT_EQ(reinterpret_cast<uintptr_t>(a) % 16, 0u) << "the allocator's blocks are 16-byte aligned";
    for (int step = 0; step < 3; ++step) {
      kernels::sgd_step(p.get(), g.get(), v.get(), n, dends.get(), ddecays.get(), static_cast<int>(ends.size()),
                        0.05f, 0.9f, nesterov, optim::sgd_fuses_multiply_add(), stream_);
      kernels::sgd_step(p1.get() + 1, g1.get() + 1, v1.get() + 1, n, dends.get(), ddecays.get(),
                        static_cast<int>(ends.size()), 0.05f, 0.9f, nesterov, optim::sgd_fuses_multiply_add(),
                        stream_);
    }
    const auto pa = p.host(), va = v.host(), pb = p1.host(), vb = v1.host();
    for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
      ASSERT_TRUE(same_bits(pa[i], pb[i + 1])) << "parameter " << i;
      ASSERT_TRUE(same_bits(va[i], vb[i + 1])) << "velocity " << i;
    }
  }
}

// The arguments a captured step passes (gpu_engine.cpp): lr and momentum from device memory
// (`hyper`: each replay's values, whatever the launch's own arguments held at the capture), and
// the fp16 step's non-finite flag (`skip`: set, the update changes neither the parameters nor the
// velocity; clear, it is the plain update). Both widths: four elements a thread (aligned, n a
// multiple of 4) and one (one float off that alignment, n odd).
TEST_F(GpuKernels, SgdStepTakesTheDevicesHyperparametersAndSkipsOnTheFlag) {
  const std::vector<int64_t> ends{3, 10, 501, 998, 1001};
  const std::vector<float> decays{0.5f, 0.f, 0.25f, 0.f, 0.125f};
  DeviceBuffer<int64_t> dends(ends);
  DeviceBuffer<float> ddecays(decays);
  const int ranges = static_cast<int>(ends.size());
  const bool fused = optim::sgd_fuses_multiply_add();
  DeviceBuffer<float> hyper(std::vector<float>{0.05f, 0.9f});
  DeviceBuffer<int> set(std::vector<int>{1}), clear(std::vector<int>{0});
  for (const int64_t n : {int64_t{1000}, int64_t{1001}}) {
    const int off = n % 4 == 0 ? 0 : 1;  // 1: off the 16-byte alignment, one element a thread
    SCOPED_TRACE(::testing::Message() << n << " elements, " << (off ? "one" : "four") << " a thread");
    std::vector<float> p0(static_cast<size_t>(n + off), 0.f), g0(p0.size(), 0.f), v0(p0.size(), 0.f);
    const auto p_rand = random_floats(static_cast<size_t>(n), 31), g_rand = random_floats(static_cast<size_t>(n), 32),
               v_rand = random_floats(static_cast<size_t>(n), 33);
    std::copy(p_rand.begin(), p_rand.end(), p0.begin() + off);
    std::copy(g_rand.begin(), g_rand.end(), g0.begin() + off);
    std::copy(v_rand.begin(), v_rand.end(), v0.begin() + off);
    // The plain update (host lr and momentum, no flag), and the same through each argument.
    DeviceBuffer<float> p(p0), v(v0), g(g0), ph(p0), vh(v0), pc(p0), vc(v0), ps(p0), vs(v0);
    kernels::sgd_step(p.get() + off, g.get() + off, v.get() + off, n, dends.get(), ddecays.get(), ranges, 0.05f, 0.9f,
                      true, fused, stream_);
    kernels::sgd_step(ph.get() + off, g.get() + off, vh.get() + off, n, dends.get(), ddecays.get(), ranges, 7.f, 3.f,
                      true, fused, stream_, nullptr, hyper.get());
    kernels::sgd_step(pc.get() + off, g.get() + off, vc.get() + off, n, dends.get(), ddecays.get(), ranges, 0.05f,
                      0.9f, true, fused, stream_, clear.get());
    kernels::sgd_step(ps.get() + off, g.get() + off, vs.get() + off, n, dends.get(), ddecays.get(), ranges, 0.05f,
                      0.9f, true, fused, stream_, set.get(), hyper.get());
    const auto want_p = p.host(), want_v = v.host();
    ASSERT_NE(std::memcmp(want_p.data(), p0.data(), p0.size() * sizeof(float)), 0) << "the update changed nothing";
    EXPECT_TRUE(same_values(ph.host(), want_p)) << "parameters, lr and momentum from the device";
    EXPECT_TRUE(same_values(vh.host(), want_v)) << "velocity, lr and momentum from the device";
    EXPECT_TRUE(same_values(pc.host(), want_p)) << "parameters, the flag clear";
    EXPECT_TRUE(same_values(vc.host(), want_v)) << "velocity, the flag clear";
    EXPECT_TRUE(same_values(ps.host(), p0)) << "parameters, the flag set";
    EXPECT_TRUE(same_values(vs.host(), v0)) << "velocity, the flag set";
  }
}

TEST_F(GpuKernels, DeviceTensorsComeZeroedFromTheCachingAllocator) {
  const size_t before = device::memory_in_use();
  {
    Tensor t(Shape{1000, 1000}, DType::F32, DeviceKind::CUDA);
    EXPECT_EQ(t.device(), DeviceKind::CUDA);
    std::vector<float> h(static_cast<size_t>(t.numel()), 1.f);
    device::copy(h.data(), t.raw(), t.bytes(), device::Copy::DeviceToHost);
    for (float v : h) ASSERT_EQ(v, 0.f);
    EXPECT_GE(device::memory_in_use(), before + t.bytes());
  }
  EXPECT_EQ(device::memory_in_use(), before);
  EXPECT_GE(device::peak_memory_in_use(), before + 4000000);
}

// ---- max-pool backward (kernels/max_pool.cu) against nn::MaxPool2d's backward -------------------

struct PoolCase {
  int64_t n, h, w, c, kernel, stride, padding = 0;
};

// Activations full of ties, as after a ReLU: 3 in 8 exact zeros (some -0), a few repeated
// levels, some negative, the rest distinct; and a NaN now and then (the first cell of a window
// wins with it, a later one never does).
std::vector<float> tied_activations(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0, 1);
  std::vector<float> v(n);
  for (float& x : v) {
    const uint32_t r = g() % 16;
    x = r < 5 ? 0.f : r == 5 ? -0.f : r == 6 ? -1.f : r < 11 ? 0.5f * static_cast<float>(r - 6) : d(g);
    if (g() % 509 == 0) x = NAN;
  }
  return v;
}

// dx of nn::MaxPool2d<float> for input x and output gradient dy (NHWC, case k).
std::vector<float> cpu_max_pool_backward(const PoolCase& k, const std::vector<float>& x, const std::vector<float>& dy) {
  ParamStore<float> store;
  nn::MaxPool2d<float> pool(k.kernel, k.stride, k.padding);
  const Shape out = pool.setup(Shape{k.h, k.w, k.c}, store, "pool");
  pool.forward(tensor_of(x, {k.n, k.h, k.w, k.c}), true);
  return host_of(pool.backward(tensor_of(dy, {k.n, out[0], out[1], k.c}), true));
}

// Bit for bit (NaN equal to NaN, +0 told from -0); a failure names how many elements differ and
// the first one's sample, row, column and channel.
::testing::AssertionResult same_pool_gradient(const std::vector<float>& got, const std::vector<float>& want,
                                              const PoolCase& k) {
  int64_t wrong = 0, first = -1;
  for (size_t i = 0; i < want.size(); ++i)
    if (!(std::isnan(got[i]) && std::isnan(want[i])) && !same_bits(got[i], want[i]))
      first = wrong++ == 0 ? static_cast<int64_t>(i) : first;
  if (wrong == 0) return ::testing::AssertionSuccess();
  const int64_t i = first, c = i % k.c, col = i / k.c % k.w, row = i / k.c / k.w % k.h, b = i / k.c / k.w / k.h;
  return ::testing::AssertionFailure() << wrong << " of " << want.size() << " dx elements differ; first dx[" << i
                                       << "] (sample " << b << ", row " << row << ", column " << col << ", channel "
                                       << c << "): got " << got[i] << ", want " << want[i];
}

// Non-overlapping windows (the fused pool's 2x2/2, a 3x3/3, a 1x1/2 with gaps between windows)
// and overlapping ones (3x3/2, 5x5/1), odd sizes whose last rows and columns no window covers,
// 1 to 64 channels (packs of 128 bits and single channels), ResNet-50's stem size; padded
// windows (torchvision's 3x3/2 padded by 1, on odd and even sizes, whose border windows hold
// 4 or 6 cells of the image; a 2x2/2 and a 5x5/1 padded to the most a kernel allows); dx equals
// the CPU layer's bit for bit in every precision, and a second run repeats it bit for bit.
TEST_F(GpuKernels, MaxPoolBackwardEqualsTheCpuLayerBitForBit) {
  const PoolCase cases[] = {{2, 7, 7, 3, 2, 2},       {2, 7, 7, 1, 3, 2},       {2, 7, 7, 64, 3, 2},
                            {2, 7, 7, 64, 2, 2},      {3, 9, 11, 8, 1, 2},      {2, 10, 9, 16, 3, 3},
                            {2, 9, 9, 4, 5, 1},       {1, 112, 112, 64, 2, 2},  {1, 112, 112, 64, 3, 2},
                            {2, 7, 7, 3, 3, 2, 1},    {2, 8, 6, 64, 3, 2, 1},   {2, 7, 8, 8, 2, 2, 1},
                            {2, 6, 7, 4, 5, 1, 2},    {1, 112, 112, 64, 3, 2, 1}};
  for (const PoolCase& k : cases) {
    const int64_t ho = (k.h + 2 * k.padding - k.kernel) / k.stride + 1;
    const int64_t wo = (k.w + 2 * k.padding - k.kernel) / k.stride + 1;
    const auto in_size = static_cast<size_t>(k.n * k.h * k.w * k.c);
    const auto out_size = static_cast<size_t>(k.n * ho * wo * k.c);
    const auto x = tied_activations(in_size, 41);
    auto dy = random_floats(out_size, 42);
    // Zeros of both signs: a winner's -0 stays -0 where windows do not overlap, and becomes +0
    // where they do (the CPU adds it to +0).
    for (size_t i = 0; i < out_size; i += 7) dy[i] = i % 2 ? 0.f : -0.f;
    for (Precision p : kStored) {
      SCOPED_TRACE(::testing::Message() << testing::name_of(p) << ", " << k.n << " x " << k.h << " x " << k.w << " x "
                                        << k.c << ", kernel " << k.kernel << " stride " << k.stride << " padding "
                                        << k.padding);
      std::vector<float> xp(in_size), dyp(out_size);
      for (size_t i = 0; i < in_size; ++i) xp[i] = testing::round_to(p, x[i]);
      for (size_t i = 0; i < out_size; ++i) dyp[i] = testing::round_to(p, dy[i]);
      auto want = cpu_max_pool_backward(k, xp, dyp);
      for (float& v : want) v = testing::round_to(p, v);  // the sum of overlapping windows' dy, rounded once
      TypedBuffer dx_in(p, xp), ddy(p, dyp), dx(p, std::vector<float>(in_size, 7.f));  // 7: no cell left unwritten
      std::vector<float> first;
      for (int run = 0; run < 2; ++run) {
        kernels::max_pool_backward(dtype_of(p), dx_in.get(), ddy.get(), dx.get(), k.n, k.h, k.w, k.c,
                                   static_cast<int>(k.kernel), static_cast<int>(k.stride),
                                   static_cast<int>(k.padding), stream_);
        const auto got = dx.host();
        if (run == 0) {
          EXPECT_TRUE(same_pool_gradient(got, want, k));
          first = got;
        } else {
          EXPECT_EQ(std::memcmp(first.data(), got.data(), got.size() * sizeof(float)), 0) << "a second run differs";
        }
      }
    }
  }
}

// The 16-byte path is taken only where x, dy and dx are all on a 16-byte boundary: each of them
// in turn one element past it (the element in front of dx left as it was), with a channel
// count that would allow the path, windows dense and overlapping, gives the same gradient
// (the emulation fails a misaligned access, as a GPU does).
TEST_F(GpuKernels, MaxPoolBackwardOffTheBoundaryIsOneChannelAThread) {
  for (const PoolCase k : {PoolCase{2, 7, 7, 64, 2, 2}, PoolCase{2, 7, 7, 64, 3, 2, 1}}) {
    const int64_t ho = (k.h + 2 * k.padding - k.kernel) / k.stride + 1;
    const int64_t wo = (k.w + 2 * k.padding - k.kernel) / k.stride + 1;
    const auto in_size = static_cast<size_t>(k.n * k.h * k.w * k.c);
    const auto out_size = static_cast<size_t>(k.n * ho * wo * k.c);
    const auto x = tied_activations(in_size, 43);
    const auto dy = random_floats(out_size, 44);
    for (Precision p : kStored) {
      std::vector<float> xp(in_size), dyp(out_size);
      for (size_t i = 0; i < in_size; ++i) xp[i] = testing::round_to(p, x[i]);
      for (size_t i = 0; i < out_size; ++i) dyp[i] = testing::round_to(p, dy[i]);
      auto want = cpu_max_pool_backward(k, xp, dyp);
      for (float& v : want) v = testing::round_to(p, v);
      const size_t bytes = dtype_size(dtype_of(p));
      for (int shifted = 0; shifted < 3; ++shifted) {  // x, dy, dx
        SCOPED_TRACE(::testing::Message() << testing::name_of(p) << ", kernel " << k.kernel << " stride " << k.stride
                                          << " padding " << k.padding << ", " << (shifted == 0 ? "x" : shifted == 1 ? "dy" : "dx")
                                          << " one element off the boundary");
        auto front = [&](const std::vector<float>& v, int which) {
          std::vector<float> out(shifted == which ? 1 : 0, 9.f);
          out.insert(out.end(), v.begin(), v.end());
          return out;
        };
        TypedBuffer dx_in(p, front(xp, 0)), ddy(p, front(dyp, 1)), dx(p, front(std::vector<float>(in_size, 7.f), 2));
        auto at = [&](const TypedBuffer& b, int which) {
          return static_cast<char*>(b.get()) + (shifted == which ? bytes : 0);
        };
        kernels::max_pool_backward(dtype_of(p), at(dx_in, 0), at(ddy, 1), at(dx, 2), k.n, k.h, k.w, k.c,
                                   static_cast<int>(k.kernel), static_cast<int>(k.stride), static_cast<int>(k.padding),
                                   stream_);
        auto got = dx.host();
        if (shifted == 2) {
          EXPECT_EQ(got.front(), 9.f) << "the element in front of dx";
          got.erase(got.begin());
        }
        EXPECT_TRUE(same_pool_gradient(got, want, k));
      }
    }
  }
}


// ---- per-channel sums (kernels/channel_sums.cu): the bias gradient of convolutions and linear layers ----

// rows x channels values k / 64 with |k| <= 255, a different mean in each channel: exact in
// fp32, bf16 and fp16 alike, and every sum of them is exact in double whatever its order, so
// the GPU's result must equal float(factor * the sum) bit for bit.
std::vector<float> exact_sum_values(int64_t rows, int64_t channels) {
  std::vector<float> v(static_cast<size_t>(rows * channels));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < channels; ++c) {
      const auto hash = static_cast<uint32_t>(r) * 2654435761u + static_cast<uint32_t>(c) * 40503u;
      const int k = static_cast<int>((hash >> 8) % 255) - 127 + 64 * static_cast<int>(c % 5 - 2);
      v[static_cast<size_t>(r * channels + c)] = static_cast<float>(k) / 64.0f;
    }
  return v;
}

// factor * the sum over rows of each channel, in double, rounded once to float.
std::vector<float> channel_sums_of(const std::vector<float>& x, int64_t rows, int64_t channels, float factor) {
  std::vector<double> sum(static_cast<size_t>(channels), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < channels; ++c) sum[static_cast<size_t>(c)] += x[static_cast<size_t>(r * channels + c)];
  std::vector<float> out(static_cast<size_t>(channels));
  for (size_t c = 0; c < out.size(); ++c) out[c] = static_cast<float>(static_cast<double>(factor) * sum[c]);
  return out;
}

// kernels::channel_sums of `values` (rows x channels, stored in precision p) read at an
// element offset (0, or 1 for a tensor that starts off a 16-byte boundary); out starts NaN,
// so a channel never written shows.
std::vector<float> gpu_channel_sums(Precision p, const std::vector<float>& values, int64_t rows, int64_t channels,
                                    float factor, int offset, cudaStream_t stream) {
  std::vector<float> shifted;
  if (offset > 0) {
    shifted.assign(static_cast<size_t>(offset), 1000.f);  // never summed
    shifted.insert(shifted.end(), values.begin(), values.end());
  }
  TypedBuffer x(p, offset > 0 ? shifted : values);
  DeviceBuffer<float> out(std::vector<float>(static_cast<size_t>(channels), NAN));
  DeviceBuffer<double> work((kernels::channel_sums_work_bytes(rows, channels) + 7) / 8);
  const void* at = static_cast<const char*>(x.get()) + offset * (p == Precision::Fp32 ? 4 : 2);
  kernels::channel_sums(dtype_of(p), at, rows, channels, factor, out.get(), work.get(), stream);
  return out.host();
}

// Every channel bit for bit; else the first that differs, with both values.
::testing::AssertionResult same_channel_sums(const std::vector<float>& got, const std::vector<float>& want) {
  for (size_t c = 0; c < want.size(); ++c)
    if (!same_bits(got[c], want[c]))
      return ::testing::AssertionFailure() << "channel " << c << " of " << want.size() << ": got " << got[c]
                                           << ", want " << want[c] << " (difference " << got[c] - want[c] << ")";
  return ::testing::AssertionSuccess();
}

// Every activation type; channel counts that take each path (1 and 3: one element a thread;
// 100: four; 32 and 64: several rows a warp; 2048: sixteen blocks of channels) and row counts
// from one row to a batch of 128 images of 28 x 28 (hundreds of slabs); a loss scale's factor
// (a power of two) and, in fp32, one that is not; and tensors that start off a 16-byte
// boundary (one element at a time).
TEST_F(GpuKernels, ChannelSumsEqualTheExactSums) {
  for (const int64_t channels : {1, 3, 32, 64, 100, 2048})
    for (const int64_t rows : {1, 7, 128 * 28 * 28}) {
      if (too_big_to_emulate(rows * channels)) continue;
      const auto x = exact_sum_values(rows, channels);
      for (const float factor : {1.0f / 1024, 0.3f}) {
        const auto want = channel_sums_of(x, rows, channels, factor);
        for (const Precision p : kStored) {
          if (factor == 0.3f && p != Precision::Fp32) continue;
          SCOPED_TRACE(::testing::Message() << testing::name_of(p) << ", " << rows << " rows x " << channels
                                            << " channels, factor " << factor);
          EXPECT_TRUE(same_channel_sums(gpu_channel_sums(p, x, rows, channels, factor, 0, stream_), want));
        }
      }
    }
  for (const int64_t channels : {32, 64, 2048}) {
    const int64_t rows = 1000;
    const auto x = exact_sum_values(rows, channels);
    for (const Precision p : kStored) {
      SCOPED_TRACE(::testing::Message() << testing::name_of(p) << ", " << rows << " rows x " << channels
                                        << " channels, one element off alignment");
      EXPECT_TRUE(same_channel_sums(gpu_channel_sums(p, x, rows, channels, 1.0f, 1, stream_),
                                    channel_sums_of(x, rows, channels, 1.0f)));
    }
  }
}

// On values whose sums round (normal, rounded to each type), two runs give the same bits, and
// each channel is within one rounding to float of the sum in double (the double sums differ
// from the host's only in their order).
TEST_F(GpuKernels, ChannelSumsRepeatBitForBit) {
  struct Case {
    int64_t rows, channels;
  };
  const float factor = 1.0f / 1024;
  for (const Case k : {Case{128 * 28 * 28, 32}, Case{128 * 14 * 14, 64}, Case{128 * 7 * 7, 2048}, Case{7, 100}})
    for (const Precision p : kStored) {
      if (too_big_to_emulate(k.rows * k.channels)) continue;
      SCOPED_TRACE(::testing::Message() << testing::name_of(p) << ", " << k.rows << " rows x " << k.channels
                                        << " channels");
      auto x = random_floats(static_cast<size_t>(k.rows * k.channels), 41);
      for (size_t i = 0; i < x.size(); ++i) x[i] = testing::round_to(p, x[i] + static_cast<float>(i % 3));
      const auto first = gpu_channel_sums(p, x, k.rows, k.channels, factor, 0, stream_);
      const auto second = gpu_channel_sums(p, x, k.rows, k.channels, factor, 0, stream_);
      EXPECT_TRUE(same_channel_sums(second, first)) << "a second run";
      const auto want = channel_sums_of(x, k.rows, k.channels, factor);
      for (size_t c = 0; c < want.size(); ++c)
        ASSERT_LE(std::fabs(first[c] - want[c]), std::ldexp(std::fabs(want[c]), -23))
            << "channel " << c << ": got " << first[c] << ", want " << want[c];
    }
}


// --jpeg-decode gpu: the random resized crop, flip and normalisation of decoded images on the GPU
// against the CPU path's (data::draw_view and data::resample, then the assembler's table) on the
// same pixels, images of several shapes with rows padded past their width (the decoder's pitch).
// Tolerance: a byte before the table may differ by one where the bilinear value lies within
// rounding of a half (the host compiler may fuse multiply-adds where nvcc does not, or the
// reverse), in at most 1 of 1000 values; a wrong geometry (a swapped axis, a missed flip, a
// half-pixel shift, the pitch ignored) moves most values of these random images by many levels.
TEST_F(GpuKernels, ResizedCropNormalisationMatchesTheCpuResample) {
  const int64_t size = 24, pad = 16;  // pad: bytes past each row's end, 255s the kernel must skip
  const std::vector<std::pair<int64_t, int64_t>> shapes{{37, 53}, {64, 48}, {29, 29}, {20, 90}};
  std::mt19937 g(7);
  std::vector<float> table(3 * 256);
  for (int c = 0; c < 3; ++c)
    for (int v = 0; v < 256; ++v)
      table[c * 256 + v] = (static_cast<float>(v) / 255.0f - kRgbNorm.mean[c]) / kRgbNorm.std[c];
  std::vector<data::Image> images;
  std::vector<std::unique_ptr<DeviceBuffer<uint8_t>>> device_images;
  std::vector<data::View> views;
  std::vector<size_t> image_of;  // per sample
  for (size_t k = 0; k < shapes.size(); ++k) {
    data::Image img;
    img.height = shapes[k].first, img.width = shapes[k].second;
    img.pixels.resize(static_cast<size_t>(img.height * img.width * 3));
    for (uint8_t& b : img.pixels) b = static_cast<uint8_t>(g() & 255u);
    std::vector<uint8_t> padded(static_cast<size_t>(img.height * (img.width * 3 + pad)), 255);
    for (int64_t y = 0; y < img.height; ++y)
      std::memcpy(&padded[static_cast<size_t>(y * (img.width * 3 + pad))],
                  &img.pixels[static_cast<size_t>(y * img.width * 3)], static_cast<size_t>(img.width * 3));
    device_images.push_back(std::make_unique<DeviceBuffer<uint8_t>>(padded));
    Philox rng(11, RngStream::Augment, 0, k);
    data::View v = data::draw_view(img.height, img.width, &rng, true);
    for (bool flip : {false, true}) {
      v.flip = flip;
      views.push_back(v);
      image_of.push_back(k);
    }
    views.push_back(data::draw_view(img.height, img.width, nullptr, false));  // evaluation's centre crop
    image_of.push_back(k);
    images.push_back(std::move(img));
  }
  const auto n = static_cast<int64_t>(views.size()), per = size * size * 3;
  std::vector<float> cpu(static_cast<size_t>(n * per));
  std::vector<kernels::ResizedCrop> crops;
  std::vector<uint8_t> bytes(static_cast<size_t>(per));
  for (int64_t i = 0; i < n; ++i) {
    const data::Image& img = images[image_of[static_cast<size_t>(i)]];
    const data::View& v = views[static_cast<size_t>(i)];
    data::resample(img, v, size, bytes.data());
    for (int64_t e = 0; e < per; ++e)
      cpu[static_cast<size_t>(i * per + e)] = table[(e % 3) * 256 + bytes[static_cast<size_t>(e)]];
    crops.push_back({device_images[image_of[static_cast<size_t>(i)]]->get(), img.width * 3 + pad,
                     static_cast<int32_t>(img.height), static_cast<int32_t>(img.width), v.y0, v.x0, v.h, v.w,
                     v.flip ? 1 : 0});
  }
  DeviceBuffer<kernels::ResizedCrop> dcrops(crops);
  DeviceBuffer<float> dtable(table), out(cpu.size());
  kernels::resized_crop_normalize(dcrops.get(), n, size, out.get(), dtable.get(), stream_);
  const auto gpu = out.host();
  size_t off = 0;
  for (size_t e = 0; e < gpu.size(); ++e) {
    if (gpu[e] == cpu[e]) continue;
    const size_t c = e % 3, pixel = e / 3, sample = pixel / static_cast<size_t>(size * size);
    const float level = table[c * 256 + 1] - table[c * 256];
    ASSERT_LE(std::fabs(gpu[e] - cpu[e]), 1.001f * level)
        << "sample " << sample << " (image " << image_of[sample] << ", flip " << views[sample].flip << ") pixel ("
        << (pixel / static_cast<size_t>(size)) % static_cast<size_t>(size) << ", " << pixel % static_cast<size_t>(size)
        << ") channel " << c << ": expected " << cpu[e] << ", got " << gpu[e] << " (one byte level is " << level << ")";
    ++off;
  }
  EXPECT_LE(off, gpu.size() / 1000) << off << " of " << gpu.size() << " values one byte level off the CPU's";
}


#ifndef HPCTRAIN_KERNELS_EMULATED  // nvJPEG and the decoder's device memory: a GPU's alone
// --jpeg-decode gpu, whole: nvJPEG's decode of a batch and the crop kernel (train/engine/gpu_decoder.cpp)
// against libjpeg-turbo's decode of the same bytes and the CPU resample. Decoders differ in their
// inverse DCT, chroma upsampling and colour conversion rounding, so the tolerance is stated in
// byte levels of the CPU's pixels: at most 10 for any value, at most 1.5 on average. Smooth
// pictures (JPEG's own kind) keep the decoders' differences small; a swapped channel order, a
// wrong pitch or offset, a missed flip or a wrong table would move values by tens of levels.
data::Image smooth_picture(int64_t h, int64_t w, int seed) {
  data::Image img;
  img.height = h, img.width = w;
  img.pixels.resize(static_cast<size_t>(h * w * 3));
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c)
        img.pixels[static_cast<size_t>((y * w + x) * 3 + c)] = static_cast<uint8_t>(
            128 + 70 * std::sin(0.045 * static_cast<double>(y) + 1.3 * c + seed) *
                      std::cos(0.031 * static_cast<double>(x) * (c + 1) + 0.4 * seed) +
            40 * static_cast<double>(x) / static_cast<double>(w) * (c == 0 ? 1 : -1));
  return img;
}

void expect_gpu_decode_matches_the_cpu(const std::vector<data::Image>& images, const std::vector<data::View>& views,
                                       int64_t side) {
  std::string why;
  if (!train::gpu_training_available(&why)) GTEST_SKIP() << why;
  if (!data::NvjpegLibrary::load_installed(&why)) GTEST_SKIP() << why;
  std::vector<float> table(3 * 256);
  for (int c = 0; c < 3; ++c)
    for (int v = 0; v < 256; ++v)
      table[c * 256 + v] = (static_cast<float>(v) / 255.0f - kRgbNorm.mean[c]) / kRgbNorm.std[c];
  const size_t n = images.size();
  const int64_t per = side * side * 3;
  data::Batch b;
  b.labels.assign(n, 0);
  b.table = &table;
  b.jpeg_side = side;
  std::vector<float> cpu(n * static_cast<size_t>(per));
  std::vector<uint8_t> bytes(static_cast<size_t>(per));
  for (size_t i = 0; i < n; ++i) {
    b.jpeg.push_back(data::encode_jpeg(images[i], 92));  // 4:2:0, as `hpcdata pack` and most photographs
    b.jpeg_samples.push_back({images[i].height, images[i].width, views[i]});
    data::resample(data::decode_jpeg(b.jpeg.back(), "test image"), views[i], side, bytes.data());
    for (int64_t e = 0; e < per; ++e)
      cpu[i * static_cast<size_t>(per) + static_cast<size_t>(e)] = table[(e % 3) * 256 + bytes[static_cast<size_t>(e)]];
  }
  const std::unique_ptr<data::BatchDecoder> decoder = train::make_gpu_decoder(0);
  for (int round = 0; round < 2; ++round) {  // the second reuses every buffer
    b.decoded = nullptr;
    decoder->decode(b);
    ASSERT_NE(b.decoded, nullptr);
    std::vector<float> gpu(cpu.size());
    device::copy(gpu.data(), b.decoded, gpu.size() * sizeof(float), device::Copy::DeviceToHost);
    double total = 0, worst = -1;
    size_t at = 0;
    for (size_t e = 0; e < gpu.size(); ++e) {
      const size_t c = e % 3;
      const double levels = std::fabs(gpu[e] - cpu[e]) / (table[c * 256 + 1] - table[c * 256]);
      total += levels;
      if (levels > worst) worst = levels, at = e;
    }
    const size_t pixel = at / 3, sample = pixel / static_cast<size_t>(side * side);
    EXPECT_LE(worst, 10.0) << "round " << round << ", sample " << sample << " pixel ("
                           << (pixel / static_cast<size_t>(side)) % static_cast<size_t>(side) << ", "
                           << pixel % static_cast<size_t>(side) << ") channel " << at % 3 << ": expected " << cpu[at]
                           << ", got " << gpu[at] << " (" << worst << " byte levels apart)";
    EXPECT_LE(total / static_cast<double>(gpu.size()), 1.5) << "round " << round << ": mean gap in byte levels";
  }
}

// The decoders alone: each image's whole view at its own size (the resample is then the identity).
TEST_F(GpuKernels, NvjpegDecodeMatchesLibjpegTurbo) {
  std::vector<data::Image> images;
  std::vector<data::View> views;
  for (int k = 0; k < 3; ++k) {
    images.push_back(smooth_picture(64, 64, k));
    views.push_back({0, 0, 64, 64, false});
  }
  expect_gpu_decode_matches_the_cpu(images, views, 64);
}

// Training's views (random resized crops, flipped and not) and evaluation's centre crops, of images
// of several shapes, as the loader draws them.
TEST_F(GpuKernels, GpuJpegDecoderMatchesTheCpuPath) {
  const std::vector<std::pair<int64_t, int64_t>> shapes{{75, 100}, {120, 90}, {57, 57}, {200, 150}};
  std::vector<data::Image> images;
  std::vector<data::View> views;
  for (size_t k = 0; k < shapes.size(); ++k) {
    const data::Image img = smooth_picture(shapes[k].first, shapes[k].second, static_cast<int>(k));
    Philox rng(5, RngStream::Augment, 1, k);
    data::View v = data::draw_view(img.height, img.width, &rng, true);
    for (bool flip : {false, true}) {
      v.flip = flip;
      images.push_back(img);
      views.push_back(v);
    }
    images.push_back(img);
    views.push_back(data::draw_view(img.height, img.width, nullptr, false));
  }
  expect_gpu_decode_matches_the_cpu(images, views, 48);
}
#endif

}  // namespace
}  // namespace hpc

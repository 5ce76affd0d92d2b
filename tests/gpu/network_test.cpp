// GPU-vs-CPU parity of every GPU layer (nn/cuda/layers.hpp), through whole models: each model
// variant below puts a different set of layers on the path (convolution with and without bias,
// batch norm alone, with ReLU, with a fused or a separate max pool, ReLU, global average pool,
// flatten, linear, residual blocks with identity and projection shortcuts). For each: logits,
// loss and the batch-norm running statistics after a training forward, and the logits of an
// eval-mode forward, against the CPU model with the same parameters, element by element
// within bounds derived from the precision's rounding and the variant's depth; every
// parameter gradient within that bound or within the spread of three passes on perturbed
// inputs, on each side (tests/gpu/compare.hpp, whose helpers compare_test proves on planted
// errors).
// Skips where no GPU is visible.
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/device.hpp"
#include "core/error.hpp"
#include "gpu/batch.hpp"
#include "gpu/compare.hpp"
#include "nn/cuda/layers.hpp"
#include "nn/cuda/network.hpp"
#include "nn/model.hpp"
#include "optim/sgd.hpp"
#include "optim/sgd_cuda.hpp"

namespace hpc {
namespace {

struct Variant {
  const char* name;
  const char* model;
  bool batch_norm, fuse;
  Shape input;
  int64_t batch;
  double smoothing;
  int depth;  // layers on the longest path: each rounds its operands and its result
};

const Variant kVariants[] = {
    {"mlp", "mlp", true, true, {28, 28, 1}, 32, 0, 3},
    {"mlp_no_bn", "mlp", false, true, {28, 28, 1}, 32, 0.1, 3},
    {"cnn", "cnn", true, true, {28, 28, 1}, 16, 0, 4},
    {"cnn_unfused", "cnn", true, false, {28, 28, 1}, 16, 0, 4},
    {"cnn_no_bn", "cnn", false, true, {28, 28, 1}, 16, 0, 4},
    {"resnet20", "resnet20", true, true, {32, 32, 3}, 8, 0, 20},
    {"resnet20_no_bn", "resnet20", false, true, {32, 32, 3}, 8, 0, 20},
    {"resnet18_imagenet_stem", "resnet18", true, true, {80, 80, 3}, 4, 0, 18},
};

std::vector<float> host_of(const Tensor& t) {
  std::vector<float> h(static_cast<size_t>(t.numel()));
  if (t.device() == DeviceKind::CUDA) device::copy(h.data(), t.raw(), t.bytes(), device::Copy::DeviceToHost);
  else std::memcpy(h.data(), t.raw(), t.bytes());
  return h;
}

class GpuNetworkParity : public ::testing::TestWithParam<std::tuple<Variant, nn::cuda::Math>> {
 protected:
  void SetUp() override {
    if (device::cuda_device_count() == 0)
      GTEST_SKIP() << "no CUDA GPU visible (" << device::describe() << "): GPU layer parity tests skipped";
    device::select_gpu(0);
  }
};

TEST_P(GpuNetworkParity, TrainingAndEvalPassesMatchTheCpuModel) {
  const auto& [v, math] = GetParam();
  // Each layer rounds its weights, its input and its result (3 roundings) in the forward pass,
  // and as many again backwards for a gradient; fp32 differs from the CPU in summation order.
  using nn::cuda::Math;
  using testing::matches;
  const auto precision = static_cast<testing::Precision>(math);  // the same four, in the same order
  const double forward = 3.0 * v.depth, backward = 6.0 * v.depth;
  nn::ModelSpec spec;
  spec.kind = parse_named(nn::kModelNames, v.model, "model");
  spec.batch_norm = v.batch_norm;
  spec.fuse = v.fuse;
  spec.input = v.input;
  spec.label_smoothing = v.smoothing;
  nn::Model<float> cpu(spec);
  cpu.init(7);

  nn::cuda::GpuContext ctx({math, true});
  // fp16 with a loss scale, as training runs it: the layers must divide it out of every
  // parameter gradient (and leave it in the data gradients between them).
  if (math == Math::Fp16) ctx.set_loss_scale(1024.0f);
  nn::cuda::GpuNetwork gpu(ctx, cpu);
  gpu.upload(cpu.params());

  const int64_t n = v.batch;
  const testing::RandomBatch batch = testing::random_batch(n, spec.input, 3);
  const Tensor &x = batch.x, &xd = batch.x_device, &ld = batch.labels_device;
  const std::vector<int32_t>& labels = batch.labels;

  // Training pass.
  const Tensor& logits_cpu = cpu.forward(x, true);
  const double loss_cpu = cpu.loss(logits_cpu, labels.data());
  cpu.backward();
  const Tensor& logits_gpu = gpu.forward(xd, true);
  gpu.loss(logits_gpu, ld.data<int32_t>());
  gpu.backward([](int64_t) {});
  const double loss_gpu = gpu.sums().loss / static_cast<double>(n);

  const auto lg = host_of(logits_gpu), lc = host_of(logits_cpu);
  EXPECT_TRUE(matches(lg, lc, precision, forward)) << "training logits";
  EXPECT_NEAR(loss_gpu, loss_cpu, testing::rounding_bound(precision, forward) * std::max(1.0, std::abs(loss_cpu)));
  const auto gg = host_of(gpu.arenas().grads()), gc = host_of(cpu.params().grads());
  const auto bg = host_of(gpu.arenas().buffers()), bc = host_of(cpu.params().buffers());
  for (const auto& slot : cpu.params().buffer_slots())
    EXPECT_TRUE(matches(bg.data() + slot.offset, bc.data() + slot.offset, slot.shape.numel(), precision, forward))
        << "running statistic " << slot.name;

  // Eval pass with the running statistics just updated.
  const Tensor& eval_cpu = cpu.forward(x, false);
  const auto ec = host_of(eval_cpu);
  const auto eg = host_of(gpu.forward(xd, false));
  EXPECT_TRUE(matches(eg, ec, precision, forward)) << "eval logits";

  // The parameter gradients, against the spread of three training passes on inputs and
  // parameters each moved by up to one unit roundoff of the precision, on the GPU and on the
  // CPU alike (compare.hpp, matches_within_spread: a ReLU or max pool at its threshold, and
  // gradients that are zero in exact arithmetic, move them by more than their magnitude's
  // rounding; the CPU's runs show where the reference itself sits at such a branch).
  const float* values = cpu.params().values().data<float>();
  const std::vector<float> original(values, values + cpu.params().values().numel());
  std::vector<std::vector<float>> runs, cpu_runs;
  for (unsigned k = 1; k <= 3; ++k) {
    std::mt19937 r(100 + k);
    std::uniform_real_distribution<double> e(-1, 1);
    const double u = testing::unit_roundoff(precision);
    auto moved = [&](float a) { return static_cast<float>(a * (1 + u * e(r))); };
    float* pv = cpu.params().values().data<float>();
    for (size_t i = 0; i < original.size(); ++i) pv[i] = moved(original[i]);
    gpu.upload(cpu.params());
    Tensor xs = Tensor::zeros<float>(x.shape());
    for (int64_t i = 0; i < x.numel(); ++i) xs.data<float>()[i] = moved(x.data<float>()[i]);
    device::copy(xd.raw(), xs.raw(), x.bytes(), device::Copy::HostToDevice);
    gpu.loss(gpu.forward(xd, true), ld.data<int32_t>());
    gpu.backward([](int64_t) {});
    runs.push_back(host_of(gpu.arenas().grads()));
    cpu.loss(cpu.forward(xs, true), labels.data());
    cpu.backward();
    cpu_runs.push_back(host_of(cpu.params().grads()));
  }
  const bool diagnose = std::getenv("HPCTRAIN_PARITY_DIAG") != nullptr;
  for (const auto& slot : cpu.params().slots()) {
    const int64_t count = slot.shape.numel();
    std::vector<const float*> at, cpu_at;
    for (const auto& run : runs) at.push_back(run.data() + slot.offset);
    for (const auto& run : cpu_runs) cpu_at.push_back(run.data() + slot.offset);
    const float *got = gg.data() + slot.offset, *want = gc.data() + slot.offset;
    EXPECT_TRUE(testing::matches_within_spread(got, want, count, at, precision, backward,
                                               slot.shape.rank() ? slot.shape.dims().back() : 1, 3, cpu_at))
        << "gradient of " << slot.name;
    if (diagnose) {  // calibration: the worst element's distance and the runs' spread, both relative
      const auto magnitude = testing::value_magnitudes(want, count);
      double need = 0;
      for (int64_t i = 0; i < count; ++i)
        need = std::max(need, std::fabs(static_cast<double>(got[i]) - want[i]) / magnitude[static_cast<size_t>(i)]);
      const auto sp = testing::spread_around(got, want, count, at, cpu_at);
      std::printf("[ spread   ] %s_%s %s n=%lld need=%.3g spread=%.3g ratio=%.3g scale=%.5f scale_spread=%.3g\n",
                  v.name, testing::name_of(precision), slot.name.c_str(), static_cast<long long>(count), need,
                  sp.element, sp.element > 0 ? need / sp.element : 0.0,
                  testing::least_squares_scale(got, want, count), sp.scale);
    }
  }
}

// Outside the macro: the braces of the suffix table do not protect its commas from it.
std::string parity_name(const ::testing::TestParamInfo<GpuNetworkParity::ParamType>& p) {
  static const char* const kSuffix[] = {"_fp32", "_tf32", "_bf16", "_fp16"};
  return std::string(std::get<0>(p.param).name) + kSuffix[static_cast<int>(std::get<1>(p.param))];
}

INSTANTIATE_TEST_SUITE_P(Models, GpuNetworkParity,
                         ::testing::Combine(::testing::ValuesIn(kVariants),
                                            ::testing::Values(nn::cuda::Math::Fp32, nn::cuda::Math::Tf32,
                                                              nn::cuda::Math::Bf16, nn::cuda::Math::Fp16)),
                         parity_name);

// The linear layer's three products through cuBLAS, y = x W^T, dW = dy^T x and dx = dy W,
// each element within the rounding bound of its own terms (testing::product_matches, which a
// transposed operand or a wrong cuBLAS op flag fails: compare_test), in fp32 and TF32.
TEST(GpuLinearProducts, EachElementIsWithinItsTermsRoundingBound) {
  if (device::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU visible: skipped";
  device::select_gpu(0);
  const int64_t n = 32, in = 48, out = 40;
  std::mt19937 g(11);
  std::normal_distribution<float> normal(0, 1);
  auto random = [&](int64_t count) {
    std::vector<float> v(static_cast<size_t>(count));
    for (float& e : v) e = normal(g);
    return v;
  };
  const auto x = random(n * in), dy = random(n * out);
  for (auto math : {nn::cuda::Math::Fp32, nn::cuda::Math::Tf32}) {
    const auto precision = static_cast<testing::Precision>(math);
    SCOPED_TRACE(testing::name_of(precision));
    ParamStore<float> store;
    nn::Linear<float> cpu(out, false);
    cpu.setup(Shape{in}, store, "fc");
    store.allocate();
    const auto w = random(out * in);  // out x in, row-major, as the layer keeps it
    std::memcpy(store.values().data<float>() + store.slots().at(cpu.weight_slot()).offset, w.data(),
                w.size() * sizeof(float));
    nn::cuda::GpuContext ctx({math, true});
    nn::cuda::DeviceArenas arenas(store);
    device::copy(arenas.values().raw(), store.values().raw(), store.values().bytes(), device::Copy::HostToDevice);
    nn::cuda::LinearGpu gpu(ctx, arenas, in, out, cpu.weight_slot(), -1);
    Tensor xd(Shape{n, in}, DType::F32, DeviceKind::CUDA), dyd(Shape{n, out}, DType::F32, DeviceKind::CUDA);
    device::copy(xd.raw(), x.data(), x.size() * sizeof(float), device::Copy::HostToDevice);
    device::copy(dyd.raw(), dy.data(), dy.size() * sizeof(float), device::Copy::HostToDevice);
    const auto y = host_of(gpu.forward(xd, true));
    const auto dx = host_of(gpu.backward(dyd, true));
    std::vector<float> dw(w.size());
    device::copy(dw.data(), arenas.grad(cpu.weight_slot()), dw.size() * sizeof(float), device::Copy::DeviceToHost);

    const auto wt = testing::transposed(w.data(), out, in), dyt = testing::transposed(dy.data(), n, out);
    EXPECT_TRUE(testing::product_matches(y.data(), testing::exact_product(x.data(), wt.data(), n, in, out).data(),
                                         x.data(), wt.data(), n, in, out, precision))
        << "y = x W^T";
    EXPECT_TRUE(testing::product_matches(dw.data(), testing::exact_product(dyt.data(), x.data(), out, n, in).data(),
                                         dyt.data(), x.data(), out, n, in, precision))
        << "dW = dy^T x";
    EXPECT_TRUE(testing::product_matches(dx.data(), testing::exact_product(dy.data(), w.data(), n, out, in).data(),
                                         dy.data(), w.data(), n, out, in, precision))
        << "dx = dy W";
  }
}

// The counted correct predictions equal the CPU's argmax count, ties included.
TEST(GpuNetworkLoss, CorrectCountAndLossOfKnownLogits) {
  if (device::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU visible: skipped";
  device::select_gpu(0);
  nn::ModelSpec spec;
  spec.kind = nn::ModelKind::Mlp;
  nn::Model<float> cpu(spec);
  nn::cuda::GpuContext ctx({nn::cuda::Math::Fp32, true});
  nn::cuda::GpuNetwork gpu(ctx, cpu);
  // 3 rows of 10: right, wrong, a tie between the label and a later class (first wins: right).
  std::vector<float> z(30, 0.f);
  z[0 * 10 + 4] = 5, z[1 * 10 + 2] = 5, z[2 * 10 + 7] = 3, z[2 * 10 + 9] = 3;
  std::vector<int32_t> labels{4, 3, 7};
  Tensor zd(Shape{3, 10}, DType::F32, DeviceKind::CUDA), ld(Shape{3}, DType::I32, DeviceKind::CUDA);
  device::copy(zd.raw(), z.data(), z.size() * sizeof(float), device::Copy::HostToDevice);
  device::copy(ld.raw(), labels.data(), labels.size() * sizeof(int32_t), device::Copy::HostToDevice);
  gpu.loss(zd, ld.data<int32_t>());
  EXPECT_EQ(gpu.sums().correct, 2);
  Tensor zc = Tensor::zeros<float>(Shape{3, 10});
  std::memcpy(zc.data<float>(), z.data(), z.size() * sizeof(float));
  EXPECT_NEAR(gpu.sums().loss, 3 * cpu.loss(zc, labels.data()), 1e-5);
}


// Batch norm and pooling compute in the activations' 16-bit type where cuDNN takes it
// (GpuContext::norm_type probes the calls those layers make). cuDNN 8 and later take bf16 and
// fp16 batch-norm inference and pooling on compute capability 8.0 and up: a probe that asks
// for more than the layers use, or asks wrongly, sends them to fp32 (slower, every result
// still right, so no parity test notices) and fails here. A refusal must leave no error behind.
TEST(GpuContextNormType, IsTheActivationTypeOnARecentCudnnAndLeavesNoError) {
  if (device::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU visible: skipped";
  device::select_gpu(0);
  int major = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  const bool recent = major >= 8 && cudnnGetVersion() >= 8000;
  for (auto math : {nn::cuda::Math::Bf16, nn::cuda::Math::Fp16}) {
    nn::cuda::GpuContext ctx({math, true});
    SCOPED_TRACE(dtype_name(ctx.act()));
    const DType t = ctx.norm_type();
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the probe left an error for the next kernel to report";
    if (recent) {
      EXPECT_EQ(t, ctx.act()) << "cuDNN " << cudnnGetVersion() << " refused a batch-norm or pooling call";
    }
    EXPECT_EQ(ctx.norm_type(), t) << "probed once";
  }
}

// cuDNN counts a tensor's elements in an int: an activation past 2^31 - 1 elements (the cnn's
// first convolution, 28 x 28 x 32, at 86,000 images a GPU) is the user's batch to make
// smaller, said as a usage error (exit 2) before cuDNN's own status would end the run as a bug.
TEST(GpuTensorDesc, AnActivationPastCudnnsElementCountIsAUsageError) {
  if (device::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU visible: skipped";
  device::select_gpu(0);
  nn::cuda::TensorDesc d;
  EXPECT_NO_THROW(d.set_nhwc(85000, 28, 28, 32, DType::BF16));  // 2,132,480,000 elements
  try {
    d.set_nhwc(86000, 28, 28, 32, DType::BF16);  // 2,157,568,000
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2) << e.what();
    EXPECT_NE(std::string(e.what()).find("--batch-size"), std::string::npos) << e.what();
  }
}

// Mixed precision's 16-bit copy of the weights (DeviceArenas::refresh_low: one conversion of the
// whole value arena at the start of every forward pass, read by the convolutions and products
// at their slots' offsets): after a forward it holds every fp32 value rounded to nearest even,
// bit for bit, and after the values change it holds the new ones: an SGD update on the device
// (then a training forward), an upload as a restore or broadcast does (then an eval forward).
// A copy refreshed only once, only on upload, or over part of the arena fails here, naming the
// first elements that differ, their slot, and the bits expected and got.
std::string slot_at(const ParamStore<float>& params, int64_t i) {
  for (const auto& s : params.slots())
    if (i >= s.offset && i < s.offset + s.shape.numel()) return s.name;
  return "alignment padding";
}

TEST(GpuNetworkLowCopy, HoldsTheValuesOfEveryForwardPassBitForBit) {
  if (device::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU visible: skipped";
  device::select_gpu(0);
  for (auto math : {nn::cuda::Math::Bf16, nn::cuda::Math::Fp16}) {
    const auto precision = static_cast<testing::Precision>(math);
    SCOPED_TRACE(testing::name_of(precision));
    nn::ModelSpec spec;  // the cnn: convolutions, batch norm and a linear layer with its bias
    nn::Model<float> cpu(spec);
    cpu.init(5);
    optim::Sgd<float> sgd(cpu.params(), {0.9, true, 5e-4, false});
    nn::cuda::GpuContext ctx({math, true});
    nn::cuda::GpuNetwork gpu(ctx, cpu);
    gpu.upload(cpu.params());
    optim::SgdCuda sgd_gpu(sgd);
    const testing::RandomBatch batch = testing::random_batch(8, spec.input, 9);
    const Tensor &xd = batch.x_device, &ld = batch.labels_device;

    auto expect_copy_of_values = [&](const char* when) {
      const auto values = host_of(gpu.arenas().values());  // synchronous: the forward is done
      const Tensor& low = gpu.arenas().values_low();
      ASSERT_TRUE(low.defined()) << when << ": no 16-bit copy";
      ASSERT_EQ(low.dtype(), math == nn::cuda::Math::Bf16 ? DType::BF16 : DType::F16) << when;
      ASSERT_EQ(low.numel(), static_cast<int64_t>(values.size())) << when;
      std::vector<uint16_t> got(values.size());
      device::copy(got.data(), low.raw(), low.bytes(), device::Copy::DeviceToHost);
      int64_t wrong = 0;
      for (size_t i = 0; i < values.size(); ++i) {
        uint16_t want = 0;
        if (precision == testing::Precision::Fp16) {
          want = testing::fp16_bits(values[i]);
        } else {
          const float r = testing::round_to(precision, values[i]);
          uint32_t bits;
          std::memcpy(&bits, &r, sizeof bits);
          want = static_cast<uint16_t>(bits >> 16);
        }
        if (got[i] != want && ++wrong <= 5)
          ADD_FAILURE() << when << ": element " << i << " (" << slot_at(cpu.params(), static_cast<int64_t>(i))
                        << ") of value " << values[i] << ": expected bits 0x" << std::hex << want << ", got 0x"
                        << got[i] << std::dec;
      }
      EXPECT_EQ(wrong, 0) << when << ": elements of the 16-bit copy that are not their value rounded";
    };

    gpu.loss(gpu.forward(xd, true), ld.data<int32_t>());
    expect_copy_of_values("after the first forward");
    gpu.backward([](int64_t) {});
    const auto before = host_of(gpu.arenas().values());
    auto& a = gpu.arenas();
    sgd_gpu.step(a.values().data<float>(), a.grads().data<float>(), 0.1, 0.9, ctx.stream());
    ASSERT_TRUE(host_of(a.values()) != before) << "the SGD step changed no value: the test would prove nothing";
    gpu.forward(xd, true);
    expect_copy_of_values("after an SGD update and a training forward");
    float* v = cpu.params().values().data<float>();
    for (int64_t i = 0; i < cpu.params().values().numel(); ++i) v[i] = -0.5f * v[i] + 1e-3f;
    gpu.upload(cpu.params());
    gpu.forward(xd, false);
    expect_copy_of_values("after an upload and an eval forward");
  }
}

}  // namespace
}  // namespace hpc

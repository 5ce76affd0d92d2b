// What the layers compute (the gradient checks only prove that backward matches forward):
// forward against naive references, batch-norm statistics, the loss, the chunked im2col
// path, float against double, and the model zoo's architectures and initialisation.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <barrier>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <regex>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "nn/gemm.hpp"
#include "nn/model.hpp"
#include "unit/gradcheck.hpp"

namespace hpc::testing {
namespace {

using nn::LayerPtr;

double max_abs(const double* p, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(p[i]));
  return m;
}

// max |a - b| / max(max|b|, tiny): one number for "these arrays agree".
template <class A>
double relative_difference(const A* a, const double* b, int64_t n) {
  double d = 0;
  for (int64_t i = 0; i < n; ++i) d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
  return d / std::max(max_abs(b, n), 1e-30);
}

// ---- Conv2d forward against the textbook definition ------------------------------------------

struct ConvCase {
  const char* name;
  int64_t h, w, cin, cout, kernel, stride, padding;
  bool bias;
};
void PrintTo(const ConvCase& c, std::ostream* os) { *os << c.name; }

// y[n, oh, ow, co] = b[co] + sum_{kh, kw, ci} x[n, oh*s - p + kh, ow*s - p + kw, ci] w[co, kh, kw, ci]
std::vector<double> naive_conv(const ConvCase& c, int64_t n, const double* x, const double* w, const double* b) {
  const int64_t ho = (c.h + 2 * c.padding - c.kernel) / c.stride + 1;
  const int64_t wo = (c.w + 2 * c.padding - c.kernel) / c.stride + 1;
  std::vector<double> y(n * ho * wo * c.cout);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t oh = 0; oh < ho; ++oh)
      for (int64_t ow = 0; ow < wo; ++ow)
        for (int64_t co = 0; co < c.cout; ++co) {
          double s = b ? b[co] : 0.0;
          for (int64_t kh = 0; kh < c.kernel; ++kh)
            for (int64_t kw = 0; kw < c.kernel; ++kw) {
              const int64_t ih = oh * c.stride - c.padding + kh, iw = ow * c.stride - c.padding + kw;
              if (ih < 0 || ih >= c.h || iw < 0 || iw >= c.w) continue;
              for (int64_t ci = 0; ci < c.cin; ++ci)
                s += x[((i * c.h + ih) * c.w + iw) * c.cin + ci] *
                     w[((co * c.kernel + kh) * c.kernel + kw) * c.cin + ci];
            }
          y[((i * ho + oh) * wo + ow) * c.cout + co] = s;
        }
  return y;
}

class ConvForward : public ::testing::TestWithParam<ConvCase> {};

TEST_P(ConvForward, MatchesNaiveConvolution) {
  const ConvCase& c = GetParam();
  ParamStore<double> store;
  nn::Conv2d<double> conv(nn::ConvSpec{c.cout, c.kernel, c.stride, c.padding, c.bias});
  const Shape out = conv.setup(Shape{c.h, c.w, c.cin}, store, "conv");
  store.allocate();
  randomize_params(store, 8);
  ASSERT_EQ(store.slots()[0].shape, Shape({c.cout, c.kernel, c.kernel, c.cin}));
  const int64_t n = 3;
  Tensor x = random_tensor(nn::batch_shape(n, Shape{c.h, c.w, c.cin}), 8, 1);
  const Tensor& y = conv.forward(x, true);
  ASSERT_EQ(y.shape(), nn::batch_shape(n, out));
  const auto want = naive_conv(c, n, x.data<double>(), store.value(0), c.bias ? store.value(1) : nullptr);
  ASSERT_EQ(static_cast<int64_t>(want.size()), y.numel());
  EXPECT_LT(relative_difference(y.data<double>(), want.data(), y.numel()), 1e-14);
}

INSTANTIATE_TEST_SUITE_P(Configs, ConvForward,
                         ::testing::Values(ConvCase{"k3s1p1", 5, 6, 3, 4, 3, 1, 1, true},
                                           ConvCase{"k3s1p1_cin1", 5, 6, 1, 4, 3, 1, 1, true},
                                           ConvCase{"k3s2p1_cin1", 7, 6, 1, 5, 3, 2, 1, false},
                                           ConvCase{"k3s2p1", 7, 7, 2, 3, 3, 2, 1, false},
                                           ConvCase{"k1s1p0", 4, 5, 6, 3, 1, 1, 0, true},
                                           ConvCase{"k1s2p0", 5, 5, 4, 3, 1, 2, 0, false},
                                           ConvCase{"k5s1p0", 6, 7, 2, 2, 5, 1, 0, true},
                                           ConvCase{"k7s2p3", 9, 8, 3, 4, 7, 2, 3, true}),
                         [](const ::testing::TestParamInfo<ConvCase>& i) { return std::string(i.param.name); });

// ---- The chunked im2col path -----------------------------------------------------------------

// A batch whose column matrix (N*Ho*Wo*K elements) is above conv.cpp's keep-columns limit
// (2^23) is built and consumed chunk by chunk; it must give what image-by-image calls give.
TEST(ConvChunkedPath, BigBatchEqualsImageByImage) {
  const int64_t n = 80, h = 16, w = 16, cin = 64, cout = 8;  // 80*256*576 = 11.8M column elements
  ASSERT_GT(n * h * w * 9 * cin, int64_t{1} << 23);
  const nn::ConvSpec spec{cout, 3, 1, 1, true};
  ParamStore<double> big_store, one_store;
  nn::Conv2d<double> big(spec), one(spec);
  big.setup(Shape{h, w, cin}, big_store, "c");
  one.setup(Shape{h, w, cin}, one_store, "c");
  big_store.allocate();
  one_store.allocate();
  randomize_params(big_store, 21);
  std::memcpy(one_store.values().raw(), big_store.values().raw(), big_store.values().bytes());
  Tensor x = random_tensor(Shape{n, h, w, cin}, 21, 1);
  Tensor dy = random_tensor(Shape{n, h, w, cout}, 21, 2);
  const Tensor& y = big.forward(x, true);
  const Tensor& dx = big.backward(dy, true);
  const int64_t xs = h * w * cin, ys = h * w * cout, wn = cout * 9 * cin;
  std::vector<double> dw_sum(wn, 0.0), db_sum(cout, 0.0);
  double worst_y = 0, worst_dx = 0;
  for (int64_t i = 0; i < n; ++i) {
    Tensor xi = x.view(i * xs, Shape{1, h, w, cin});
    Tensor dyi = dy.view(i * ys, Shape{1, h, w, cout});
    const Tensor& yi = one.forward(xi, true);
    worst_y = std::max(worst_y, relative_difference(y.data<double>() + i * ys, yi.data<double>(), ys));
    const Tensor& dxi = one.backward(dyi, true);
    worst_dx = std::max(worst_dx, relative_difference(dx.data<double>() + i * xs, dxi.data<double>(), xs));
    for (int64_t k = 0; k < wn; ++k) dw_sum[k] += one_store.grad(0)[k];
    for (int64_t k = 0; k < cout; ++k) db_sum[k] += one_store.grad(1)[k];
  }
  EXPECT_LT(worst_y, 1e-13);
  EXPECT_LT(worst_dx, 1e-13);
  EXPECT_LT(relative_difference(big_store.grad(0), dw_sum.data(), wn), 1e-12);
  EXPECT_LT(relative_difference(big_store.grad(1), db_sum.data(), cout), 1e-12);

  // The float im2col path (what runs when the library convolution declines) chunks the same
  // way; it must agree with the double results to float precision.
  nn::Conv2d<float> flt(nn::ConvSpec{cout, 3, 1, 1, true, /*library=*/false});
  ParamStore<float> fstore;
  flt.setup(Shape{h, w, cin}, fstore, "c");
  fstore.allocate();
  for (int64_t i = 0; i < big_store.values().numel(); ++i)
    fstore.values().data<float>()[i] = static_cast<float>(big_store.values().data<double>()[i]);
  Tensor xf = Tensor::zeros<float>(x.shape()), dyf = Tensor::zeros<float>(dy.shape());
  for (int64_t i = 0; i < x.numel(); ++i) xf.data<float>()[i] = static_cast<float>(x.data<double>()[i]);
  for (int64_t i = 0; i < dy.numel(); ++i) dyf.data<float>()[i] = static_cast<float>(dy.data<double>()[i]);
  const Tensor& yf = flt.forward(xf, true);
  EXPECT_LT(relative_difference(yf.data<float>(), y.data<double>(), y.numel()), 1e-5);
  const Tensor& dxf = flt.backward(dyf, true);
  EXPECT_LT(relative_difference(dxf.data<float>(), dx.data<double>(), dx.numel()), 1e-5);
  EXPECT_LT(relative_difference(fstore.grad(0), big_store.grad(0), wn), 1e-5);
  EXPECT_LT(relative_difference(fstore.grad(1), big_store.grad(1), cout), 1e-5);
}

// ---- Float against double --------------------------------------------------------------------

// The same layer in float and in double, with the same parameters and input: forward output,
// input gradient and parameter gradients agree to float precision. This covers the float GEMM
// backend and every float-only code path (training runs in float).
struct ParityResult {
  double y = 0, dx = 0, grads = 0;
};

ParityResult float_double_parity(const std::function<LayerPtr<float>()>& make_f,
                                 const std::function<LayerPtr<double>()>& make_d, const Shape& sample, int64_t batch,
                                 double input_shift = 0, double input_scale = 1) {
  ParamStore<float> fs;
  ParamStore<double> ds;
  LayerPtr<float> lf = make_f();
  LayerPtr<double> ld = make_d();
  const Shape out = ld->setup(sample, ds, "l");
  EXPECT_EQ(lf->setup(sample, fs, "l"), out);
  fs.allocate();
  ds.allocate();
  randomize_params(ds, 31);
  // Round the double parameters and input to float, so both start from the same numbers.
  double* dv = ds.values().data<double>();
  float* fv = fs.values().data<float>();
  for (int64_t i = 0; i < ds.values().numel(); ++i) fv[i] = static_cast<float>(dv[i]), dv[i] = fv[i];
  Tensor xd = random_tensor(nn::batch_shape(batch, sample), 31, 1, input_scale);
  Tensor rd = random_tensor(nn::batch_shape(batch, out), 31, 2);
  Tensor xf = Tensor::zeros<float>(xd.shape()), rf = Tensor::zeros<float>(rd.shape());
  for (int64_t i = 0; i < xd.numel(); ++i)
    xf.data<float>()[i] = static_cast<float>(input_shift + xd.data<double>()[i]), xd.data<double>()[i] = xf.data<float>()[i];
  for (int64_t i = 0; i < rd.numel(); ++i)
    rf.data<float>()[i] = static_cast<float>(rd.data<double>()[i]), rd.data<double>()[i] = rf.data<float>()[i];
  ParityResult r;
  const Tensor& yd = ld->forward(xd, true);
  const Tensor& yf = lf->forward(xf, true);
  r.y = relative_difference(yf.data<float>(), yd.data<double>(), yd.numel());
  const Tensor& dxd = ld->backward(rd, true);
  const Tensor& dxf = lf->backward(rf, true);
  r.dx = relative_difference(dxf.data<float>(), dxd.data<double>(), dxd.numel());
  for (size_t i = 0; i < ds.slots().size(); ++i)
    r.grads = std::max(r.grads, relative_difference(fs.grad(static_cast<int>(i)), ds.grad(static_cast<int>(i)),
                                                    ds.slots()[i].shape.numel()));
  return r;
}

template <template <class> class L, class... Args>
void expect_parity(const Shape& sample, int64_t batch, double tol, Args... args) {
  const ParityResult r = float_double_parity([&] { return LayerPtr<float>(new L<float>(args...)); },
                                             [&] { return LayerPtr<double>(new L<double>(args...)); }, sample, batch);
  EXPECT_LT(r.y, tol) << "forward";
  EXPECT_LT(r.dx, tol) << "input gradient";
  EXPECT_LT(r.grads, tol) << "parameter gradients";
}

// Float convolutions run on the library (oneDNN) where it has a kernel, else on our im2col
// path; double always on im2col. Both float paths are compared with double.
TEST(FloatDoubleParity, Conv2d) {
  for (bool library : {true, false}) {
    SCOPED_TRACE(library ? "library convolution" : "im2col convolution");
    expect_parity<nn::Conv2d>(Shape{12, 12, 1}, 4, 1e-5, nn::ConvSpec{8, 3, 1, 1, true, library});  // one channel
    expect_parity<nn::Conv2d>(Shape{10, 10, 16}, 4, 1e-5, nn::ConvSpec{24, 3, 1, 1, false, library});
    expect_parity<nn::Conv2d>(Shape{9, 9, 8}, 3, 1e-5, nn::ConvSpec{16, 3, 2, 1, true, library});
    expect_parity<nn::Conv2d>(Shape{6, 6, 32}, 4, 1e-5, nn::ConvSpec{16, 1, 1, 0, true, library});  // 1x1
    expect_parity<nn::Conv2d>(Shape{7, 7, 8}, 2, 1e-5, nn::ConvSpec{16, 1, 2, 0, false, library});
    expect_parity<nn::Conv2d>(Shape{9, 9, 3}, 2, 1e-5, nn::ConvSpec{8, 7, 2, 3, false, library});  // stem
  }
}

// Winograd (winograd.cpp), F(2x2, 3x3) and F(4x4, 3x3), serves float 3x3 convolutions with
// stride 1, padding 1 and 8+ channels: its output, input gradient and weight gradient agree
// with double im2col, as oneDNN's direct kernel (winograd = false) does, for image sizes that
// are and are not multiples of the tile (tiles that hang over the edge), with and without
// bias, over one and several blocks of tiles.
TEST(FloatDoubleParity, Conv2dWinograd) {
  EXPECT_TRUE(nn::winograd_fits({64, 14, 14, 32, 64, 3, 1, 1, false}));  // cnn's conv2
  EXPECT_FALSE(nn::winograd_fits({64, 28, 28, 1, 32, 3, 1, 1, false}));  // conv1: one channel
  EXPECT_FALSE(nn::winograd_fits({64, 14, 14, 32, 64, 3, 2, 1, false}));
  EXPECT_TRUE(nn::winograd_fits({32, 16, 16, 128, 128, 3, 1, 1, false}));
  EXPECT_FALSE(nn::winograd_fits({32, 8, 8, 128, 256, 3, 1, 1, false}));  // weights past the L2
  // F(4x4) where it has fewer multiply-adds and 64+ channels each way: resnet18's 64- and
  // 128-channel layers, not the cnn's conv2 (32 in), nor images too small for 4x4 tiles.
  EXPECT_EQ(nn::winograd_tile({64, 14, 14, 32, 64, 3, 1, 1, false}), 2);
  EXPECT_EQ(nn::winograd_tile({32, 16, 16, 64, 64, 3, 1, 1, false}), 4);
  EXPECT_EQ(nn::winograd_tile({32, 8, 8, 128, 128, 3, 1, 1, false}), 4);
  EXPECT_EQ(nn::winograd_tile({32, 2, 2, 64, 64, 3, 1, 1, false}), 2);
  EXPECT_EQ(nn::winograd_tile({32, 1, 9, 64, 64, 3, 1, 1, false}), 2);
  for (int tile : {2, 4, 0}) {
    for (bool winograd : {true, false}) {
      if (!winograd && tile != 0) continue;
      SCOPED_TRACE(winograd ? "winograd, tile " + std::to_string(tile) : "direct");
      auto spec = [&](int64_t cout, bool bias) { return nn::ConvSpec{cout, 3, 1, 1, bias, true, 1, winograd, true, tile}; };
      expect_parity<nn::Conv2d>(Shape{14, 14, 32}, 3, 1e-5, spec(64, false));
      expect_parity<nn::Conv2d>(Shape{9, 7, 8}, 2, 1e-5, spec(16, true));
      expect_parity<nn::Conv2d>(Shape{5, 6, 24}, 5, 1e-5, spec(8, true));
      expect_parity<nn::Conv2d>(Shape{1, 1, 8}, 2, 1e-5, spec(8, true));
      expect_parity<nn::Conv2d>(Shape{12, 16, 16}, 40, 1e-5, spec(16, false));  // several blocks either way
      expect_parity<nn::Conv2d>(Shape{10, 11, 64}, 2, 1e-5, spec(64, true));     // tile 0: F(4x4)
    }
  }
}

// Our narrow direct kernel (narrow_conv.cpp) computes the weight gradient of convolutions with
// at most 32 inputs per output (cnn's conv1: 3x3 over one channel): it agrees with double
// im2col, as oneDNN's kernel (narrow = false) does, for one and three channels, strides 1
// and 2, 3x3 and 5x5 kernels, with and without bias, output channels that are not a multiple
// of its 32-channel blocks, and images with and without padding.
TEST(FloatDoubleParity, Conv2dNarrow) {
  EXPECT_TRUE(nn::narrow_fits({64, 28, 28, 1, 32, 3, 1, 1, false}));  // cnn's conv1
  EXPECT_TRUE(nn::narrow_fits({8, 32, 32, 3, 16, 3, 1, 1, true}));    // RGB, 27 + bias
  EXPECT_FALSE(nn::narrow_fits({8, 32, 32, 4, 16, 3, 1, 1, false}));  // 36 inputs
  EXPECT_FALSE(nn::narrow_fits({8, 32, 32, 8, 16, 1, 1, 0, false}));  // 1x1: a plain GEMM
  EXPECT_FALSE(nn::narrow_fits({64, 14, 14, 32, 64, 3, 1, 1, false}));
  for (bool narrow : {true, false}) {
    SCOPED_TRACE(narrow ? "narrow" : "library");
    auto spec = [narrow](int64_t cout, int64_t kernel, int64_t stride, int64_t padding, bool bias) {
      return nn::ConvSpec{cout, kernel, stride, padding, bias, true, 1, true, narrow};
    };
    expect_parity<nn::Conv2d>(Shape{12, 12, 1}, 4, 1e-5, spec(32, 3, 1, 1, false));
    expect_parity<nn::Conv2d>(Shape{11, 9, 1}, 3, 1e-5, spec(40, 3, 1, 1, true));
    expect_parity<nn::Conv2d>(Shape{9, 10, 3}, 2, 1e-5, spec(8, 3, 2, 1, true));
    expect_parity<nn::Conv2d>(Shape{10, 10, 1}, 3, 1e-5, spec(16, 5, 1, 2, false));
    expect_parity<nn::Conv2d>(Shape{9, 9, 3}, 2, 1e-5, spec(33, 3, 2, 0, false));
  }
}

// The float outputs and gradients of one forward and backward pass of a fresh layer with the
// given spec, parameters and input from fixed seeds, on `threads` math threads.
std::vector<float> conv_pass_results(const nn::ConvSpec& spec, const Shape& sample, int64_t batch, int threads) {
  nn::set_math_threads(threads);
  ParamStore<float> store;
  nn::Conv2d<float> conv(spec);
  const Shape out = conv.setup(sample, store, "c");
  store.allocate();
  Philox rng(5, RngStream::Test);
  float* v = store.values().data<float>();
  for (int64_t i = 0; i < store.values().numel(); ++i) v[i] = static_cast<float>(rng.uniform() - 0.5);
  Tensor x = Tensor::zeros<float>(nn::batch_shape(batch, sample)), r = Tensor::zeros<float>(nn::batch_shape(batch, out));
  for (Tensor* t : {&x, &r})
    for (int64_t i = 0; i < t->numel(); ++i) t->data<float>()[i] = static_cast<float>(rng.uniform() - 0.5);
  const Tensor& y = conv.forward(x, true);
  std::vector<float> all(y.data<float>(), y.data<float>() + y.numel());
  const Tensor& dx = conv.backward(r, true);
  all.insert(all.end(), dx.data<float>(), dx.data<float>() + dx.numel());
  all.insert(all.end(), store.grad(0), store.grad(0) + store.slots()[0].shape.numel());
  nn::set_math_threads(1);
  return all;
}

// With two or three math threads the blocks of tiles are split among them (cnn's conv2 at
// batch 8 is 5 blocks) and the weight gradient is summed over a fixed split of the blocks:
// output, input gradient and weight gradient have the same bits as on one thread.
// conv_pass_results on two and three threads has the same bits as on one.
void expect_same_bits_on_any_thread_count(const nn::ConvSpec& spec, const Shape& sample, int64_t batch) {
  const std::vector<float> one = conv_pass_results(spec, sample, batch, 1);
  for (int threads : {2, 3}) {
    const std::vector<float> many = conv_pass_results(spec, sample, batch, threads);
    ASSERT_EQ(many.size(), one.size());
    EXPECT_EQ(std::memcmp(many.data(), one.data(), one.size() * sizeof(float)), 0) << threads << " threads";
  }
}

TEST(Conv2dWinograd, AnyThreadCountGivesTheSameBits) {
  for (int tile : {2, 4}) {
    SCOPED_TRACE("tile " + std::to_string(tile));
    expect_same_bits_on_any_thread_count(nn::ConvSpec{64, 3, 1, 1, false, true, 1, true, true, tile}, Shape{14, 14, 32},
                                         8 * tile / 2);
  }
}

// The weight gradient of the narrow kernel is summed over a fixed split of the rows of
// pixels (cnn's conv1 at batch 4 is 28 chunks): the same bits on one, two and three threads.
TEST(Conv2dNarrow, AnyThreadCountGivesTheSameBits) {
  expect_same_bits_on_any_thread_count(nn::ConvSpec{32, 3, 1, 1, true}, Shape{28, 28, 1}, 4);
}

// The float matrix product has the same bits on any thread count (oneDNN's own threading
// splits K among threads for some shapes: the first two from 2 threads, the cnn's first dense
// layer's from 8), and its tiles add up to the product: against double, with every
// transposition, for alpha and beta and leading dimensions wider than the matrices.
// What the CPU layers compute with, as the config event and checkpoints record it
// (nn::cpu_kernels; dnnl_kernels.hpp in a oneDNN build): the library, its version and the
// instruction set it chose, said once where GEMM and convolution both
// use it. With ONEDNN_MAX_CPU_ISA unset the set is the CPU's widest of AVX-512 and AVX2.
TEST(Gemm, TheKernelsNameTheLibraryItsVersionAndTheInstructionSetItChose) {
  const std::string k = nn::cpu_kernels();
  if (std::string(nn::gemm_backend()) != "onednn") {
    EXPECT_EQ(k.rfind("OpenBLAS ", 0), 0u) << k;
    return;
  }
  std::smatch m;
  ASSERT_TRUE(std::regex_match(k, m, std::regex("oneDNN [0-9]+\\.[0-9]+\\.[0-9]+ ([a-z0-9_]+)"))) << k;
  if (std::getenv("ONEDNN_MAX_CPU_ISA") || std::getenv("DNNL_MAX_CPU_ISA")) return;
  std::ifstream cpuinfo("/proc/cpuinfo");
  const std::string text((std::istreambuf_iterator<char>(cpuinfo)), std::istreambuf_iterator<char>());
  const std::string isa = m[1].str();
  if (text.find(" avx512f ") != std::string::npos) EXPECT_EQ(isa.rfind("avx512", 0), 0u) << isa;
  else if (text.find(" avx2 ") != std::string::npos) EXPECT_EQ(isa.rfind("avx2", 0), 0u) << isa;
}

TEST(Gemm, AnyThreadCountGivesTheSameBits) {
  struct Case {
    bool ta, tb;
    int64_t m, n, k;
  };
  for (const Case& g : {Case{false, true, 64, 256, 784}, Case{true, false, 256, 784, 64}, Case{false, true, 32, 128, 3136},
                        Case{true, false, 64, 576, 4096}, Case{false, false, 200, 100, 300}, Case{true, true, 7, 300, 900}}) {
    SCOPED_TRACE(::testing::Message() << g.ta << g.tb << " " << g.m << "x" << g.n << "x" << g.k);
    const int64_t lda = (g.ta ? g.m : g.k) + 3, ldb = (g.tb ? g.k : g.n) + 5, ldc = g.n + 2;
    const int64_t a_rows = g.ta ? g.k : g.m, b_rows = g.tb ? g.n : g.k;
    Philox rng(7, RngStream::Test);
    std::vector<float> a(a_rows * lda), b(b_rows * ldb), c0(g.m * ldc);
    for (std::vector<float>* v : {&a, &b, &c0})
      for (float& x : *v) x = static_cast<float>(rng.uniform() - 0.5);
    std::vector<double> ad(a.begin(), a.end()), bd(b.begin(), b.end()), cd(c0.begin(), c0.end());
    nn::gemm(g.ta, g.tb, g.m, g.n, g.k, 0.5, ad.data(), lda, bd.data(), ldb, 0.25, cd.data(), ldc);
    std::vector<float> one;
    for (int threads : {1, 2, 3, 8, 16}) {
      nn::set_math_threads(threads);
      std::vector<float> c = c0;
      nn::gemm(g.ta, g.tb, g.m, g.n, g.k, 0.5f, a.data(), lda, b.data(), ldb, 0.25f, c.data(), ldc);
      nn::set_math_threads(1);
      if (one.empty()) {
        one = c;
        double worst = 0;
        for (int64_t i = 0; i < g.m; ++i)
          for (int64_t j = 0; j < ldc; ++j) {
            const int64_t at = i * ldc + j;
            if (j >= g.n) ASSERT_EQ(c[at], c0[at]) << "past the row's end, at " << i << "," << j;
            else worst = std::max(worst, std::abs(c[at] - cd[at]) / (std::abs(cd[at]) + 1));
          }
        EXPECT_LT(worst, 1e-5);
      }
      EXPECT_EQ(std::memcmp(c.data(), one.data(), c.size() * sizeof(float)), 0) << threads << " threads";
    }
  }
}

// Batch norm's sums over rows (its statistics, and the gradient's two sums) are taken over a
// split of the rows that their count alone gives, so all it computes has the same bits on one,
// three and eight threads; the values span 2^-20 to 2^20, so that the order of the double sums
// shows in the float results.
TEST(BatchNorm, AnyThreadCountGivesTheSameBits) {
  const Shape sample{16, 16, 8};
  const int64_t batch = 64;  // 16384 rows: 32 parts of 512
  std::vector<std::vector<uint8_t>> one;
  for (int threads : {1, 3, 8}) {
    nn::set_math_threads(threads);
    ParamStore<float> store;
    nn::BatchNorm<float> bn;
    bn.setup(sample, store, "bn");
    store.allocate();
    Philox rng(11, RngStream::Test);
    for (int64_t i = 0; i < store.values().numel(); ++i) store.values().data<float>()[i] = static_cast<float>(1 + 0.5 * rng.normal());
    Tensor x = Tensor::zeros<float>(nn::batch_shape(batch, sample)), dy = Tensor::zeros<float>(x.shape());
    for (Tensor* t : {&x, &dy})
      for (int64_t i = 0; i < t->numel(); ++i)
        t->data<float>()[i] = static_cast<float>(std::ldexp(rng.normal(), static_cast<int>(rng.uniform() * 40) - 20));
    std::vector<std::vector<uint8_t>> got;
    auto keep = [&](const void* p, size_t bytes) { got.emplace_back(static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + bytes); };
    const Tensor& y = bn.forward(x, true);
    keep(y.raw(), y.bytes());
    const Tensor& dx = bn.backward(dy, true);
    keep(dx.raw(), dx.bytes());
    keep(store.grads().raw(), store.grads().bytes());
    keep(store.buffers().raw(), store.buffers().bytes());
    nn::set_math_threads(1);
    if (one.empty()) one = got;
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(got[i] == one[i]) << "result " << i << " on " << threads << " threads";
  }
}

// oneDNN's weight gradient (its threads split the sum over the samples by their number) is
// summed over a fixed split of the batch into groups, each a single-threaded oneDNN pass: the
// same bits on one, two and three threads, for a strided 3x3 and a 1x1 convolution (resnet20's
// downsampling layers, which neither Winograd nor the narrow kernel serves). 10 samples: groups
// of one and of two.
TEST(Conv2dLibrary, AnyThreadCountGivesTheSameBits) {
  expect_same_bits_on_any_thread_count(nn::ConvSpec{32, 3, 2, 1, true}, Shape{16, 16, 16}, 10);
  expect_same_bits_on_any_thread_count(nn::ConvSpec{32, 1, 1, 0, false}, Shape{8, 8, 24}, 10);
}

// One float layer called with changing batch sizes (the last, short batch of an epoch; the
// evaluation batches) gives the double results for each: on the narrow kernel (1 channel in),
// oneDNN (4) and Winograd (8).
class Conv2dAcrossBatchSizes : public ::testing::TestWithParam<int64_t> {};
INSTANTIATE_TEST_SUITE_P(FloatDoubleParity, Conv2dAcrossBatchSizes, ::testing::Values(1, 4, 8));
TEST_P(Conv2dAcrossBatchSizes, AgreesWithDouble) {
  const nn::ConvSpec spec{12, 3, 1, 1, true};
  const Shape sample{8, 8, GetParam()};
  ParamStore<float> fs;
  ParamStore<double> ds;
  nn::Conv2d<float> cf(spec);
  nn::Conv2d<double> cd(spec);
  cf.setup(sample, fs, "c");
  cd.setup(sample, ds, "c");
  fs.allocate();
  ds.allocate();
  randomize_params(ds, 12);
  for (int64_t i = 0; i < ds.values().numel(); ++i)
    fs.values().data<float>()[i] = static_cast<float>(ds.values().data<double>()[i]),
    ds.values().data<double>()[i] = fs.values().data<float>()[i];
  for (int64_t batch : {4, 3, 4, 1, 6}) {
    SCOPED_TRACE(::testing::Message() << "batch " << batch);
    Tensor xd = random_tensor(nn::batch_shape(batch, sample), 12, 10 + batch);
    Tensor rd = random_tensor(nn::batch_shape(batch, Shape{8, 8, 12}), 12, 20 + batch);
    Tensor xf = Tensor::zeros<float>(xd.shape()), rf = Tensor::zeros<float>(rd.shape());
    for (int64_t i = 0; i < xd.numel(); ++i)
      xf.data<float>()[i] = static_cast<float>(xd.data<double>()[i]), xd.data<double>()[i] = xf.data<float>()[i];
    for (int64_t i = 0; i < rd.numel(); ++i)
      rf.data<float>()[i] = static_cast<float>(rd.data<double>()[i]), rd.data<double>()[i] = rf.data<float>()[i];
    const Tensor& yd = cd.forward(xd, true);
    const Tensor& yf = cf.forward(xf, true);
    ASSERT_EQ(yf.shape(), yd.shape());
    EXPECT_LT(relative_difference(yf.data<float>(), yd.data<double>(), yd.numel()), 1e-5);
    const Tensor& dxd = cd.backward(rd, true);
    const Tensor& dxf = cf.backward(rf, true);
    EXPECT_LT(relative_difference(dxf.data<float>(), dxd.data<double>(), dxd.numel()), 1e-5);
    for (int p = 0; p < 2; ++p)
      EXPECT_LT(relative_difference(fs.grad(p), ds.grad(p), ds.slots()[p].shape.numel()), 1e-5) << "param " << p;
  }
}

TEST(FloatDoubleParity, SimpleLayers) {
  expect_parity<nn::Linear>(Shape{300}, 16, 1e-5, int64_t{40}, true);
  expect_parity<nn::ReLU>(Shape{5, 5, 4}, 3, 1e-6);
  expect_parity<nn::GlobalAvgPool>(Shape{7, 7, 16}, 3, 1e-6);
}

TEST(FloatDoubleParity, BatchNorm) {
  expect_parity<nn::BatchNorm>(Shape{14, 14, 16}, 32, 1e-4);
  expect_parity<nn::BatchNorm>(Shape{64}, 64, 1e-4);
  expect_parity<nn::BatchNorm>(Shape{14, 14, 16}, 32, 1e-4, true);  // fused ReLU
}

// Statistics of 50k rows whose mean (100) is a thousand times their spread (0.1): float
// accumulation must not lose the variance. A one-pass E[x^2] - E[x]^2 in float is off by
// about 1e-2 here; the shifted sums by about 1e-5 (the float inputs' own rounding).
TEST(FloatDoubleParity, BatchNormOfOffsetActivations) {
  auto f = [] { return LayerPtr<float>(new nn::BatchNorm<float>()); };
  auto d = [] { return LayerPtr<double>(new nn::BatchNorm<double>()); };
  const ParityResult r = float_double_parity(f, d, Shape{28, 28, 8}, 64, /*shift=*/100.0, /*scale=*/0.1);
  EXPECT_LT(r.y, 3e-4) << "forward";
  EXPECT_LT(r.dx, 3e-4) << "input gradient";
  EXPECT_LT(r.grads, 3e-4) << "parameter gradients";
}

TEST(FloatDoubleParity, WholeModels) {
  for (const auto& [name, kind] : nn::kModelNames) {
    if (kind == nn::ModelKind::ResNet18 || kind == nn::ModelKind::ResNet50) continue;  // resnet20's layers, far more work
    for (bool bn : {true, false}) {
      nn::ModelSpec spec;
      spec.kind = kind;
      spec.batch_norm = bn;
      spec.input = Shape{12, 12, 1};
      nn::Model<float> mf(spec);
      nn::Model<double> md(spec);
      md.init(5);
      mf.init(5);
      const double* dv = md.params().values().data<double>();
      const float* fv = mf.params().values().data<float>();
      ASSERT_EQ(md.params().values().numel(), mf.params().values().numel());
      // Initialisation draws the same numbers in both precisions.
      for (int64_t i = 0; i < md.params().values().numel(); ++i) ASSERT_EQ(fv[i], static_cast<float>(dv[i]));
      for (int64_t i = 0; i < md.params().values().numel(); ++i) md.params().values().data<double>()[i] = fv[i];
      Tensor xd = random_tensor(nn::batch_shape(8, spec.input), 5, 1);
      Tensor xf = Tensor::zeros<float>(xd.shape());
      for (int64_t i = 0; i < xd.numel(); ++i)
        xf.data<float>()[i] = static_cast<float>(xd.data<double>()[i]), xd.data<double>()[i] = xf.data<float>()[i];
      const std::vector<int32_t> labels{0, 1, 2, 3, 4, 5, 6, 7};
      const double ld = md.train_step(xd, labels.data());
      const double lf = mf.train_step(xf, labels.data());
      EXPECT_NEAR(lf, ld, 1e-5 * std::fabs(ld)) << name << " bn=" << bn;
      const double d = relative_difference(mf.params().grads().data<float>(), md.params().grads().data<double>(),
                                           md.params().grads().numel());
      EXPECT_LT(d, 1e-3) << name << " bn=" << bn;
    }
  }
}

// ---- Batch norm statistics -------------------------------------------------------------------

TEST(BatchNormForward, TrainNormalisesAndUpdatesRunningStatistics) {
  ParamStore<double> store;
  nn::BatchNorm<double> bn;  // momentum 0.1, eps 1e-5
  bn.setup(Shape{2}, store, "bn");
  store.allocate();
  store.value(0)[0] = 2.0, store.value(0)[1] = 0.5;  // gamma
  store.value(1)[0] = 1.0, store.value(1)[1] = -1.0;  // beta
  // Channel 0: 1, 2, 3, 6 (mean 3, biased var 3.5, unbiased 14/3); channel 1: all 4.
  Tensor x = Tensor::zeros<double>(Shape{4, 2});
  const double v[8] = {1, 4, 2, 4, 3, 4, 6, 4};
  std::copy(v, v + 8, x.data<double>());
  const Tensor& y = bn.forward(x, true);
  const double inv0 = 1 / std::sqrt(3.5 + 1e-5), inv1 = 1 / std::sqrt(1e-5);
  for (int r = 0; r < 4; ++r) {
    EXPECT_NEAR(y.data<double>()[r * 2], 2.0 * (v[r * 2] - 3) * inv0 + 1.0, 1e-12);
    EXPECT_NEAR(y.data<double>()[r * 2 + 1], 0.5 * (4 - 4) * inv1 - 1.0, 1e-9);
  }
  const double* rmean = store.buffer(0);
  const double* rvar = store.buffer(1);
  EXPECT_NEAR(rmean[0], 0.3, 1e-12);
  EXPECT_NEAR(rmean[1], 0.4, 1e-12);
  EXPECT_NEAR(rvar[0], 0.9 + 0.1 * 14.0 / 3, 1e-12);
  EXPECT_NEAR(rvar[1], 0.9, 1e-12);
  // Evaluation uses the running statistics, and leaves them alone.
  const Tensor& e = bn.forward(x, false);
  for (int r = 0; r < 4; ++r)
    EXPECT_NEAR(e.data<double>()[r * 2], 2.0 * (v[r * 2] - rmean[0]) / std::sqrt(rvar[0] + 1e-5) + 1.0, 1e-12);
  EXPECT_NEAR(rmean[0], 0.3, 1e-12);
}

TEST(BatchNormForward, SingleValuePerChannelInTrainingIsAUsageError) {
  ParamStore<double> store;
  nn::BatchNorm<double> bn;
  bn.setup(Shape{1, 1, 3}, store, "bn");
  store.allocate();
  Tensor x = Tensor::zeros<double>(Shape{1, 1, 1, 3});
  try {
    bn.forward(x, true);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    EXPECT_NE(std::string(e.what()).find("batch"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(bn.forward(x, false));  // evaluation of one sample is fine
}

// ---- Batch norm with statistics over every rank (--sync-batch-norm) --------------------------

// Ranks as threads: the StatsSum each gets adds their vectors in rank order, as an all-reduce.
class ThreadRanks {
 public:
  explicit ThreadRanks(int n) : barrier_(n), parts_(n) {}
  nn::StatsSum sum_for(int rank) {
    return [this, rank](double* data, int64_t n) {
      parts_[rank].assign(data, data + n);
      barrier_.arrive_and_wait();
      std::vector<double> total(n, 0.0);
      for (const auto& p : parts_)
        for (int64_t i = 0; i < n; ++i) total[i] += p[i];
      barrier_.arrive_and_wait();  // every rank has read the parts before one writes again
      std::copy(total.begin(), total.end(), data);
    };
  }

 private:
  std::barrier<> barrier_;
  std::vector<std::vector<double>> parts_;
};

// Ranks holding `rows` samples each (of the global batch, in order) with synchronised statistics
// compute what one batch norm over the whole batch does, as the trainer uses them: each rank's dy
// is the gradient of the mean loss over its own samples, and the gradient all-reduce weighs each
// rank's gradients by its share of the global batch (dist/bucketer.hpp). So a rank's outputs and
// running statistics are the whole batch's, and share times its dx (what reaches the earlier
// layers' gradients, which are weighed alike) and the weighed sum of its gamma and beta
// gradients are the whole batch's. Shards are uneven where the global batch is no multiple of the
// world size, and on the short last batch of --keep-last-batch.
void expect_sync_batch_norm_is_one_batch(const std::vector<int64_t>& rows) {
  const Shape sample{2, 3, 4};  // NHWC rows: the statistics are over samples and cells
  int64_t total = 0;
  for (int64_t r : rows) total += r;
  const Tensor x = random_tensor(nn::batch_shape(total, sample), 31, 1, 2.0);
  const Tensor dl = random_tensor(x.shape(), 31, 2);  // gradient of the summed per-sample losses
  const int64_t per_sample = sample.numel();
  auto make = [&](ParamStore<double>& store, nn::BatchNorm<double>& bn) {
    bn.setup(sample, store, "bn");
    store.allocate();
    fill_normal(store.values().data<double>(), store.values().numel(), 31, 3, 0.3, 1.0);
    fill_normal(store.buffers().data<double>(), store.buffers().numel(), 31, 4, 0.1, 1.0);
  };
  auto scaled = [&](int64_t first, int64_t n, double by) {
    Tensor t = Tensor::zeros<double>(nn::batch_shape(n, sample));
    for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = dl.data<double>()[first * per_sample + i] * by;
    return t;
  };
  ParamStore<double> one_store;
  nn::BatchNorm<double> one;
  make(one_store, one);
  const Tensor y1 = one.forward(x, true);
  const Tensor dx1 = one.backward(scaled(0, total, 1.0 / static_cast<double>(total)), true);

  const int world = static_cast<int>(rows.size());
  ThreadRanks ranks(world);
  std::vector<ParamStore<double>> stores(world);
  std::vector<std::unique_ptr<nn::BatchNorm<double>>> bns;
  std::vector<Tensor> ys(world), dxs(world);
  for (int r = 0; r < world; ++r) {
    bns.push_back(std::make_unique<nn::BatchNorm<double>>());
    make(stores[r], *bns[r]);
    bns[r]->sync_statistics(ranks.sum_for(r));
  }
  std::vector<std::thread> threads;
  int64_t first = 0;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r, first] {
      Tensor xr = Tensor::zeros<double>(nn::batch_shape(rows[r], sample));
      std::copy(x.data<double>() + first * per_sample, x.data<double>() + (first + rows[r]) * per_sample,
                xr.data<double>());
      ys[r] = bns[r]->forward(xr, true);
      dxs[r] = bns[r]->backward(scaled(first, rows[r], 1.0 / static_cast<double>(rows[r])), true);
    });
    first += rows[r];
  }
  for (auto& t : threads) t.join();

  std::vector<double> grads(one_store.grads().numel(), 0.0);
  first = 0;
  for (int r = 0; r < world; ++r) {
    SCOPED_TRACE(::testing::Message() << "rank " << r);
    const double share = static_cast<double>(rows[r]) / static_cast<double>(total);
    for (int64_t i = 0; i < rows[r] * per_sample; ++i) {
      ASSERT_NEAR(ys[r].data<double>()[i], y1.data<double>()[first * per_sample + i], 1e-12) << "y " << i;
      ASSERT_NEAR(share * dxs[r].data<double>()[i], dx1.data<double>()[first * per_sample + i], 1e-12) << "dx " << i;
    }
    for (int64_t i = 0; i < one_store.buffers().numel(); ++i)
      EXPECT_NEAR(stores[r].buffers().data<double>()[i], one_store.buffers().data<double>()[i], 1e-12) << "buffer " << i;
    for (size_t i = 0; i < grads.size(); ++i) grads[i] += share * stores[r].grads().data<double>()[i];
    first += rows[r];
  }
  for (size_t i = 0; i < grads.size(); ++i) EXPECT_NEAR(grads[i], one_store.grads().data<double>()[i], 1e-12) << i;
}

TEST(SyncBatchNorm, EvenShardsComputeTheWholeBatch) { expect_sync_batch_norm_is_one_batch({4, 4}); }

// 64 samples on 3 ranks are 21, 21 and 22.
TEST(SyncBatchNorm, UnevenShardsComputeTheWholeBatch) {
  expect_sync_batch_norm_is_one_batch({3, 5});
  expect_sync_batch_norm_is_one_batch({2, 2, 3});
}

// ---- Batch norm with a fused max pool -------------------------------------------------------

// The fused layer gives exactly the bits of BatchNorm [ReLU] then MaxPool2d: outputs (train
// and eval), input gradients, parameter gradients and running statistics. Sizes are odd and
// channels not a multiple of the vector width, so remainders and uncovered cells are hit.
TEST(BatchNormFusedPool, IdenticalToSeparateLayers) {
  struct Case {
    int64_t kernel, stride;
    bool relu;
  };
  const Shape sample{13, 11, 20};
  for (const Case& k : {Case{2, 2, true}, Case{2, 2, false}, Case{3, 3, true}, Case{2, 3, true}}) {
    SCOPED_TRACE(::testing::Message() << "kernel " << k.kernel << " stride " << k.stride << " relu " << k.relu);
    ParamStore<float> fs, us;
    nn::BatchNorm<float> fused(k.relu, nn::FusedPool{k.kernel, k.stride});
    nn::Sequential<float> unfused;
    unfused.add(LayerPtr<float>(new nn::BatchNorm<float>(k.relu)));
    unfused.add(LayerPtr<float>(new nn::MaxPool2d<float>(k.kernel, k.stride)));
    const Shape out = fused.setup(sample, fs, "bn");
    ASSERT_EQ(out, unfused.setup(sample, us, "bn"));
    fs.allocate();
    us.allocate();
    Philox rng(3, RngStream::Test);
    for (int64_t i = 0; i < fs.values().numel(); ++i)
      us.values().data<float>()[i] = fs.values().data<float>()[i] = static_cast<float>(1 + 0.5 * rng.normal());
    const int64_t batch = 6;
    Tensor x = Tensor::zeros<float>(nn::batch_shape(batch, sample));
    Tensor dy = Tensor::zeros<float>(nn::batch_shape(batch, out));
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(0.3 + 2 * rng.normal());
    for (int64_t i = 0; i < dy.numel(); ++i) dy.data<float>()[i] = static_cast<float>(rng.normal());
    auto same = [](const Tensor& a, const Tensor& b) {
      return a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
    };
    for (int round = 0; round < 2; ++round) {  // the second round reuses every buffer
      EXPECT_TRUE(same(fused.forward(x, true), unfused.forward(x, true))) << "train forward";
      EXPECT_TRUE(same(fused.backward(dy, true), unfused.backward(dy, true))) << "input gradient";
      EXPECT_TRUE(same(fs.grads(), us.grads())) << "parameter gradients";
      EXPECT_TRUE(same(fs.buffers(), us.buffers())) << "running statistics";
      EXPECT_TRUE(same(fused.forward(x, false), unfused.forward(x, false))) << "eval forward";
      for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] *= -0.75f;
    }
  }
}

TEST(BatchNormFusedPool, RejectsOverlappingWindows) {
  ParamStore<float> store;
  nn::BatchNorm<float> bn(true, nn::FusedPool{3, 2});
  EXPECT_THROW(bn.setup(Shape{8, 8, 4}, store, "bn"), Error);
}

// ---- Cheap layers ----------------------------------------------------------------------------

TEST(SimpleLayersForward, MaxPoolPicksWindowMaxima) {
  ParamStore<double> store;
  nn::MaxPool2d<double> pool(2, 2);
  EXPECT_EQ(pool.setup(Shape{3, 5, 1}, store, "p"), Shape({1, 2, 1}));  // last row and column dropped
  Tensor x = Tensor::zeros<double>(Shape{1, 3, 5, 1});
  const double v[15] = {1, 9, 2, 3, 7, 4, 5, 8, 6, 0, 99, 99, 99, 99, 99};
  std::copy(v, v + 15, x.data<double>());
  const Tensor& y = pool.forward(x, true);
  EXPECT_EQ(y.data<double>()[0], 9);
  EXPECT_EQ(y.data<double>()[1], 8);
  Tensor dy = Tensor::zeros<double>(Shape{1, 1, 2, 1});
  dy.data<double>()[0] = 1.5, dy.data<double>()[1] = -2;
  const Tensor& dx = pool.backward(dy, true);
  for (int i = 0; i < 15; ++i) EXPECT_EQ(dx.data<double>()[i], i == 1 ? 1.5 : i == 7 ? -2 : 0) << i;
}

// A padded max pool, straight from the definition (PyTorch's MaxPool2d): window (oh, ow) covers
// rows oh*s - p .. oh*s - p + k - 1 of the image and the same columns; padding cells never win;
// the first maximum in row-major order does; dx adds each window's dy at its winner.
struct PaddedPoolCase {
  int64_t n, h, w, c, k, s, p;
};

void direct_padded_pool(const PaddedPoolCase& g, const std::vector<double>& x, const std::vector<double>& dy,
                        std::vector<double>& y, std::vector<double>& dx) {
  const int64_t ho = (g.h + 2 * g.p - g.k) / g.s + 1, wo = (g.w + 2 * g.p - g.k) / g.s + 1;
  y.assign(static_cast<size_t>(g.n * ho * wo * g.c), 0);
  dx.assign(x.size(), 0);
  for (int64_t b = 0; b < g.n; ++b)
    for (int64_t oh = 0; oh < ho; ++oh)
      for (int64_t ow = 0; ow < wo; ++ow)
        for (int64_t ch = 0; ch < g.c; ++ch) {
          int64_t best = -1;
          for (int64_t r = oh * g.s - g.p; r < oh * g.s - g.p + g.k; ++r)
            for (int64_t col = ow * g.s - g.p; col < ow * g.s - g.p + g.k; ++col) {
              if (r < 0 || r >= g.h || col < 0 || col >= g.w) continue;
              const int64_t i = ((b * g.h + r) * g.w + col) * g.c + ch;
              if (best < 0 || x[static_cast<size_t>(i)] > x[static_cast<size_t>(best)]) best = i;
            }
          const auto o = static_cast<size_t>(((b * ho + oh) * wo + ow) * g.c + ch);
          y[o] = x[static_cast<size_t>(best)];
          dx[static_cast<size_t>(best)] += dy[o];
        }
}

// Against the direct form: torchvision's 3x3/2 padded by 1 on odd and even sizes (border windows
// of 4 and 6 cells), a padded 2x2/2 whose corner windows hold one cell, a 5x5/1 padded by 2;
// inputs of few levels (ties everywhere) and all negative (a padding cell that took part as 0
// would win there).
TEST(SimpleLayersForward, PaddedMaxPoolMatchesTheDirectForm) {
  const PaddedPoolCase cases[] = {{2, 7, 7, 3, 3, 2, 1}, {2, 8, 6, 2, 3, 2, 1}, {1, 5, 6, 2, 2, 2, 1},
                                  {1, 6, 5, 2, 5, 1, 2}, {1, 9, 8, 1, 3, 3, 1}};
  for (const PaddedPoolCase& g : cases) {
    for (bool negative : {false, true}) {
      SCOPED_TRACE(::testing::Message() << g.h << " x " << g.w << " x " << g.c << ", " << g.k << "x" << g.k << "/"
                                        << g.s << " pad " << g.p << (negative ? ", all negative" : ", ties"));
      ParamStore<double> store;
      nn::MaxPool2d<double> pool(g.k, g.s, g.p);
      const Shape out = pool.setup(Shape{g.h, g.w, g.c}, store, "p");
      Tensor x = Tensor::zeros<double>(Shape{g.n, g.h, g.w, g.c});
      Philox rng(5, RngStream::Test, static_cast<uint64_t>(g.h * 100 + g.k * 10 + g.p));
      std::vector<double> xv(static_cast<size_t>(x.numel()));
      for (double& v : xv) v = negative ? -1.0 - rng.below(3) : static_cast<double>(rng.below(3)) - 1.0;
      std::copy(xv.begin(), xv.end(), x.data<double>());
      Tensor dy = Tensor::zeros<double>(nn::batch_shape(g.n, out));
      std::vector<double> dyv(static_cast<size_t>(dy.numel()));
      for (double& v : dyv) v = static_cast<double>(rng.below(64)) - 31.5;
      std::copy(dyv.begin(), dyv.end(), dy.data<double>());
      std::vector<double> want_y, want_dx;
      direct_padded_pool(g, xv, dyv, want_y, want_dx);
      const Tensor& y = pool.forward(x, true);
      ASSERT_EQ(static_cast<size_t>(y.numel()), want_y.size());
      for (size_t i = 0; i < want_y.size(); ++i) ASSERT_EQ(y.data<double>()[i], want_y[i]) << "y[" << i << "]";
      const Tensor& dx = pool.backward(dy, true);
      for (size_t i = 0; i < want_dx.size(); ++i) ASSERT_EQ(dx.data<double>()[i], want_dx[i]) << "dx[" << i << "]";
    }
  }
}

TEST(SimpleLayersForward, MaxPoolPaddingIsBoundByHalfTheKernel) {
  ParamStore<float> store;
  nn::MaxPool2d<float> pool(3, 2, 2);  // a window of padding alone
  EXPECT_THROW(pool.setup(Shape{8, 8, 1}, store, "p"), Error);
}

TEST(SimpleLayersForward, GlobalAvgPoolReluFlattenLinear) {
  ParamStore<double> store;
  nn::GlobalAvgPool<double> gap;
  EXPECT_EQ(gap.setup(Shape{2, 2, 2}, store, "g"), Shape({2}));
  Tensor x = Tensor::zeros<double>(Shape{1, 2, 2, 2});
  const double v[8] = {1, -1, 2, -2, 3, -3, 6, 2};
  std::copy(v, v + 8, x.data<double>());
  const Tensor& g = gap.forward(x, true);
  EXPECT_DOUBLE_EQ(g.data<double>()[0], 3.0);
  EXPECT_DOUBLE_EQ(g.data<double>()[1], -1.0);

  nn::ReLU<double> relu;
  const Tensor& r = relu.forward(x, true);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(r.data<double>()[i], std::max(v[i], 0.0));

  nn::Flatten<double> flat;
  EXPECT_EQ(flat.setup(Shape{2, 2, 2}, store, "f"), Shape({8}));
  EXPECT_EQ(flat.forward(x, true).shape(), Shape({1, 8}));

  nn::Linear<double> lin(2, true);
  EXPECT_EQ(lin.setup(Shape{3}, store, "lin"), Shape({2}));
  store.allocate();
  const double w[6] = {1, 2, 3, -1, 0, 1};  // out x in
  std::copy(w, w + 6, store.value(0));
  store.value(1)[0] = 0.5, store.value(1)[1] = -0.5;
  Tensor in = Tensor::zeros<double>(Shape{1, 3});
  in.data<double>()[0] = 1, in.data<double>()[1] = 2, in.data<double>()[2] = 3;
  const Tensor& y = lin.forward(in, true);
  EXPECT_DOUBLE_EQ(y.data<double>()[0], 14.5);
  EXPECT_DOUBLE_EQ(y.data<double>()[1], 1.5);
}

// ---- Softmax cross-entropy -------------------------------------------------------------------

TEST(SoftmaxCrossEntropyForward, KnownValues) {
  nn::SoftmaxCrossEntropy<double> loss;
  Tensor z = Tensor::zeros<double>(Shape{2, 4});  // uniform logits: log 4 whatever the label
  const std::vector<int32_t> labels{1, 3};
  EXPECT_NEAR(loss.forward(z, labels.data()), std::log(4.0), 1e-15);
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(loss.probabilities().data<double>()[i], 0.25, 1e-15);
  // Huge logits do not overflow.
  z.data<double>()[1] = 1000;
  z.data<double>()[7] = 1000;
  const double l = loss.forward(z, labels.data());
  EXPECT_TRUE(std::isfinite(l));
  EXPECT_NEAR(l, 0.0, 1e-12);
  z.data<double>()[1] = 0;
  z.data<double>()[0] = 1000;
  EXPECT_NEAR(loss.forward(z, labels.data()), 1000.0 / 2, 1e-9);  // sample 0 loses by 1000
}

TEST(SoftmaxCrossEntropyForward, LabelSmoothingAsPyTorch) {
  const double s = 0.2;
  nn::SoftmaxCrossEntropy<double> loss(s);
  Tensor z = random_tensor(Shape{3, 5}, 4, 1);
  const std::vector<int32_t> labels{4, 0, 2};
  const double got = loss.forward(z, labels.data());
  double want = 0;
  for (int r = 0; r < 3; ++r) {
    const double* zr = z.data<double>() + r * 5;
    double lse = 0;
    for (int j = 0; j < 5; ++j) lse += std::exp(zr[j]);
    lse = std::log(lse);
    for (int j = 0; j < 5; ++j) want -= ((j == labels[r] ? 1 - s : 0) + s / 5) * (zr[j] - lse);
  }
  EXPECT_NEAR(got, want / 3, 1e-14);
}

// ---- Model zoo -------------------------------------------------------------------------------

nn::ModelSpec spec_of(const std::string& name, bool bn, Shape input) {
  nn::ModelSpec s;
  s.kind = parse_named(nn::kModelNames, name, "model");
  s.batch_norm = bn;
  s.input = std::move(input);
  return s;
}

TEST(ModelZoo, NamesAndUnknownName) {
  EXPECT_EQ(names_of(nn::kModelNames), "mlp, cnn, resnet20, resnet18 or resnet50");
  try {
    nn::Model<float> m(spec_of("resnet101", true, Shape{28, 28, 1}));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    EXPECT_NE(std::string(e.what()).find("resnet101"), std::string::npos);
  }
}

// Parameter counts of the published architectures (10 classes).
TEST(ModelZoo, ParameterCounts) {
  auto count = [](const std::string& name, bool bn, Shape in) {
    return nn::Model<float>(spec_of(name, bn, std::move(in))).params().param_count();
  };
  // cnn: conv 1->32 (+bias, BN), conv 32->64 (+bias, BN), fc 3136->128, fc 128->10.
  EXPECT_EQ(count("cnn", true, Shape{28, 28, 1}), 320 + 64 + 18496 + 128 + 401536 + 1290);
  EXPECT_EQ(count("cnn", false, Shape{28, 28, 1}), 320 + 18496 + 401536 + 1290);
  // mlp: 784->512->256->10; with batch norm the hidden linears lose their bias.
  EXPECT_EQ(count("mlp", true, Shape{28, 28, 1}), 401408 + 1024 + 131072 + 512 + 2570);
  EXPECT_EQ(count("mlp", false, Shape{28, 28, 1}), 401920 + 131328 + 2570);
  // ResNet-20 with 1x1-conv projection shortcuts (He et al. option B).
  EXPECT_EQ(count("resnet20", true, Shape{32, 32, 3}), 272474);
  // ResNet-18 with the CIFAR stem (3x3 conv, no max pool) and with the ImageNet stem.
  EXPECT_EQ(count("resnet18", true, Shape{32, 32, 3}), 11173962);
  EXPECT_EQ(count("resnet18", true, Shape{96, 96, 3}), 11181642);
  // ResNet-50 on 224x224 with 10 classes: torchvision's resnet50(num_classes=10), 23528522.
  EXPECT_EQ(count("resnet50", true, Shape{224, 224, 3}), 23528522);
}

TEST(ModelZoo, VariantsWithoutBatchNormHaveNoNormParameters) {
  for (const auto& [name, kind] : nn::kModelNames) {
    nn::Model<float> m(spec_of(name, false, Shape{16, 16, 1}));
    for (const auto& s : m.params().slots()) {
      EXPECT_NE(s.role, ParamRole::NormScale) << name << " " << s.name;
      EXPECT_NE(s.role, ParamRole::NormShift) << name << " " << s.name;
    }
    EXPECT_TRUE(m.params().buffer_slots().empty()) << name;
    nn::Model<float> with(spec_of(name, true, Shape{16, 16, 1}));
    EXPECT_FALSE(with.params().buffer_slots().empty()) << name;
  }
}

TEST(ModelZoo, ForwardGivesLogitsPerSample) {
  for (const auto& [name, kind] : nn::kModelNames) {
    nn::ModelSpec spec = spec_of(name, true, Shape{28, 28, 1});
    spec.classes = 7;
    nn::Model<float> m(spec);
    m.init(1);
    Tensor x = Tensor::zeros<float>(Shape{2, 28, 28, 1});
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(std::sin(i * 0.1));
    const Tensor& y = m.forward(x, false);
    ASSERT_EQ(y.shape(), Shape({2, 7})) << name;
    for (int64_t i = 0; i < y.numel(); ++i) EXPECT_TRUE(std::isfinite(y.data<float>()[i])) << name;
  }
}

// A freshly initialised classifier should be unsure: its loss near chance (ln 10 = 2.3), its
// logits of order one. He et al.'s initialisation keeps the activations' scale through ReLU
// layers, so logits of a few units (loss up to ~5) are expected; far larger ones make the first
// steps blow up. (Each residual sum without batch norm doubles the activations' variance.)
TEST(ModelZoo, InitialLossIsNearChance) {
  Tensor x = Tensor::zeros<float>(Shape{8, 28, 28, 1});
  Philox rng(2, RngStream::Test);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(rng.normal());
  const std::vector<int32_t> labels{0, 1, 2, 3, 4, 5, 6, 7};
  for (const auto& [name, kind] : nn::kModelNames) {
    for (bool bn : {true, false}) {
      nn::Model<float> m(spec_of(name, bn, Shape{28, 28, 1}));
      m.init(1);
      const double loss = m.loss(m.forward(x, true), labels.data());
      EXPECT_LT(loss, 10.0) << name << (bn ? "" : " without batch norm");
    }
  }
}

// Models with batch norm + ReLU + max pool fused (the default) and kept apart train to the
// same bits: three steps of SGD, then the same parameters. The ResNet ImageNet stem's pool
// (3x3/2 padded by 1: overlapping, padded windows) is never fused, so there both are one model.
TEST(ModelZoo, FusedAndSeparateLayersTrainIdentically) {
  struct Case {
    std::string name;
    Shape input;
    bool fuses;
  };
  for (const Case& c : {Case{"cnn", Shape{28, 28, 1}, true}, Case{"resnet18", Shape{66, 66, 3}, false}}) {
    const std::string& name = c.name;
    const Shape& input = c.input;
    SCOPED_TRACE(name);
    nn::ModelSpec spec = spec_of(name, true, input);
    nn::ModelSpec apart = spec;
    apart.fuse = false;
    nn::Model<float> f(spec), u(apart);
    if (c.fuses) EXPECT_LT(f.net().layers().size(), u.net().layers().size());
    else EXPECT_EQ(f.net().layers().size(), u.net().layers().size());
    f.init(4);
    u.init(4);
    Tensor x = Tensor::zeros<float>(nn::batch_shape(4, input));
    Philox rng(4, RngStream::Test);
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(rng.normal());
    const std::vector<int32_t> labels{1, 3, 5, 7};
    for (int step = 0; step < 3; ++step) {
      EXPECT_EQ(f.train_step(x, labels.data()), u.train_step(x, labels.data()));
      for (nn::Model<float>* m : {&f, &u}) {
        float* v = m->params().values().data<float>();
        const float* g = m->params().grads().data<float>();
        for (int64_t i = 0; i < m->params().values().numel(); ++i) v[i] -= 0.05f * g[i];
      }
    }
    const auto& vf = f.params().values();
    EXPECT_EQ(std::memcmp(vf.raw(), u.params().values().raw(), vf.bytes()), 0);
  }
}

TEST(ModelZoo, InitIsDeterministicAndFollowsRoles) {
  nn::Model<float> a(spec_of("cnn", true, Shape{28, 28, 1})), b(spec_of("cnn", true, Shape{28, 28, 1})),
      c(spec_of("cnn", true, Shape{28, 28, 1}));
  a.init(17);
  b.init(17);
  c.init(18);
  const auto& va = a.params().values();
  EXPECT_EQ(std::memcmp(va.raw(), b.params().values().raw(), va.bytes()), 0);
  EXPECT_NE(std::memcmp(va.raw(), c.params().values().raw(), va.bytes()), 0);
  // Each weight tensor has its own stream: the first two do not start with the same draw.
  const auto& slots = a.params().slots();
  std::vector<int> weights;
  for (size_t i = 0; i < slots.size(); ++i)
    if (slots[i].role == ParamRole::Weight) weights.push_back(static_cast<int>(i));
  ASSERT_GE(weights.size(), 2u);
  EXPECT_NE(a.params().value(weights[0])[0] / std::sqrt(2.0 / slots[weights[0]].fan_in),
            a.params().value(weights[1])[0] / std::sqrt(2.0 / slots[weights[1]].fan_in));
}

// Kaiming uniform (the default): weights and biases U(+-g/sqrt(fan_in)), as PyTorch's Conv2d
// and Linear, g the layer's init_gain (0: all zero, as the last convolution of a residual branch
// without batch norm). Kaiming normal: weights N(0, g^2 * 2/fan_in), biases zero. Either way
// batch-norm shifts start at zero, scales at one.
TEST(ModelZoo, InitFollowsRolesAndGains) {
  for (nn::InitScheme scheme : {nn::InitScheme::KaimingUniform, nn::InitScheme::KaimingNormal}) {
    for (const auto& [name, bn] : {std::pair<std::string, bool>{"cnn", true}, {"mlp", false}, {"resnet20", true},
                                   {"resnet20", false}}) {
      SCOPED_TRACE(name + (bn ? "" : " without batch norm") + (scheme == nn::InitScheme::KaimingNormal ? ", normal" : ", uniform"));
      nn::ModelSpec spec = spec_of(name, bn, Shape{28, 28, 1});
      spec.init = scheme;
      nn::Model<float> m(spec);
      m.init(17);
      const auto& slots = m.params().slots();
      int zero_gain = 0;
      for (size_t i = 0; i < slots.size(); ++i) {
        const float* p = m.params().value(static_cast<int>(i));
        const int64_t n = slots[i].shape.numel();
        double s = 0, s2 = 0, largest = 0;
        for (int64_t j = 0; j < n; ++j) s += p[j], s2 += double{p[j]} * p[j], largest = std::max(largest, std::fabs(double{p[j]}));
        const double fan_in = static_cast<double>(slots[i].fan_in), gain = slots[i].init_gain;
        const bool uniform_bias = slots[i].role == ParamRole::Bias && scheme == nn::InitScheme::KaimingUniform;
        const bool trained = slots[i].role == ParamRole::Weight || uniform_bias;
        if (trained && gain == 0) {
          zero_gain += !uniform_bias;
          EXPECT_EQ(s2, 0.0) << slots[i].name;
          continue;
        }
        if (trained) {
          const double want = scheme == nn::InitScheme::KaimingNormal ? gain * std::sqrt(2.0 / fan_in)
                                                            : gain / std::sqrt(fan_in) / std::sqrt(3.0);
          const double std = std::sqrt(s2 / n - (s / n) * (s / n));
          if (n >= 64) {
            EXPECT_NEAR(std / want, 1.0, 6 / std::sqrt(2.0 * n)) << slots[i].name;
          }
          EXPECT_NEAR(s / n, 0.0, 6 * want / std::sqrt(n)) << slots[i].name;
          if (scheme == nn::InitScheme::KaimingUniform) {
            EXPECT_LE(largest, gain / std::sqrt(fan_in)) << slots[i].name;
          }
          continue;
        }
        if (slots[i].role == ParamRole::NormScale) {
          EXPECT_EQ(s, static_cast<double>(n)) << slots[i].name;
          EXPECT_EQ(s2, static_cast<double>(n)) << slots[i].name;
        } else {
          EXPECT_EQ(s2, 0.0) << slots[i].name;
        }
      }
      // Only the residual branches of the variant without batch norm start at zero (9 blocks).
      EXPECT_EQ(zero_gain, name == "resnet20" && !bn ? 9 : 0);
    }
  }
}

}  // namespace
}  // namespace hpc::testing

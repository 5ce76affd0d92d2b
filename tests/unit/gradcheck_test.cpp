// Finite-difference gradient checks of every layer and every model, in double.
#include "unit/gradcheck.hpp"

#include <gtest/gtest.h>

#include <algorithm>

#include <memory>
#include <string>

#include "nn/model.hpp"

namespace hpc::testing {
namespace {

using nn::LayerPtr;
using nn::Sequential;

// A layer with its own parameter store, a random input and random upstream weights.
struct Harness {
  ParamStore<double> store;
  LayerPtr<double> layer;
  Tensor x, r;

  Harness(LayerPtr<double> l, const Shape& sample, int64_t batch, uint64_t seed = 42) : layer(std::move(l)) {
    const Shape out = layer->setup(sample, store, "layer");
    store.allocate();
    randomize_params(store, seed);
    x = random_tensor(nn::batch_shape(batch, sample), seed, 1);
    r = random_tensor(nn::batch_shape(batch, out), seed, 2);
  }
  // The layer points at the store: a Harness must never be copied or moved.
  Harness(const Harness&) = delete;
  Harness& operator=(const Harness&) = delete;
  GradCheckReport check(const GradCheckOptions& o = {}, bool need_dx = true) {
    return check_layer(*layer, store, x, r, o, need_dx);
  }
};

template <class L, class... Args>
LayerPtr<double> make(Args&&... args) {
  return std::make_unique<L>(std::forward<Args>(args)...);
}

#define EXPECT_GRADIENTS_OK(report)          \
  do {                                       \
    const GradCheckReport rep_ = (report);   \
    EXPECT_TRUE(rep_.ok()) << rep_.str();    \
  } while (0)

// ---- Conv2d ----------------------------------------------------------------------------------

struct ConvCase {
  const char* name;
  int64_t h, w, cin, cout, kernel, stride, padding;
  bool bias;
  int64_t batch;
};
void PrintTo(const ConvCase& c, std::ostream* os) { *os << c.name; }

class ConvGradient : public ::testing::TestWithParam<ConvCase> {};

TEST_P(ConvGradient, MatchesCentralDifferences) {
  const ConvCase& c = GetParam();
  Harness h(make<nn::Conv2d<double>>(nn::ConvSpec{c.cout, c.kernel, c.stride, c.padding, c.bias}),
            Shape{c.h, c.w, c.cin}, c.batch);
  const GradCheckReport rep = h.check();
  EXPECT_TRUE(rep.ok()) << rep.str();
  ASSERT_EQ(rep.tensors.size(), c.bias ? 3u : 2u);
  // Every input element and weight was checked, and none has a vanishing gradient.
  EXPECT_EQ(rep.tensors[0].checked, h.x.numel());
  EXPECT_GT(rep.tensors[1].max_analytic, 0.1);
}

INSTANTIATE_TEST_SUITE_P(
    Configs, ConvGradient,
    ::testing::Values(ConvCase{"k3s1p1_cin3_bias", 5, 5, 3, 4, 3, 1, 1, true, 2},
                      ConvCase{"k3s1p1_cin3_nobias", 5, 4, 3, 4, 3, 1, 1, false, 2},
                      ConvCase{"k3s1p1_cin1_bias", 6, 5, 1, 4, 3, 1, 1, true, 2},
                      ConvCase{"k3s1p1_cin1_nobias", 5, 5, 1, 3, 3, 1, 1, false, 3},
                      ConvCase{"k3s2p1_cin3_odd", 7, 7, 3, 4, 3, 2, 1, true, 2},
                      ConvCase{"k3s2p1_cin1_even", 6, 6, 1, 4, 3, 2, 1, true, 2},
                      ConvCase{"k3s1p0_valid", 6, 5, 2, 3, 3, 1, 0, true, 2},
                      ConvCase{"k1s1p0_direct_bias", 4, 4, 5, 6, 1, 1, 0, true, 2},
                      ConvCase{"k1s1p0_direct_nobias", 3, 5, 5, 6, 1, 1, 0, false, 2},
                      ConvCase{"k1s1p0_cin1", 4, 4, 1, 3, 1, 1, 0, true, 2},
                      ConvCase{"k1s2p0_projection", 5, 5, 3, 6, 1, 2, 0, false, 2},
                      ConvCase{"k5s1p2_cin2", 5, 6, 2, 3, 5, 1, 2, true, 2},
                      ConvCase{"k7s2p3_stem", 9, 9, 3, 4, 7, 2, 3, false, 2},
                      ConvCase{"batch1", 5, 5, 2, 3, 3, 1, 1, true, 1}),
    [](const ::testing::TestParamInfo<ConvCase>& i) { return std::string(i.param.name); });

// The first layer of a model is called with need_dx = false: weight gradients must still be right.
TEST(ConvGradientNoDx, WeightsAreRightWithoutInputGradient) {
  for (int64_t cin : {1, 3}) {
    Harness h(make<nn::Conv2d<double>>(nn::ConvSpec{4, 3, 1, 1, true}), Shape{5, 5, cin}, 2);
    EXPECT_GRADIENTS_OK(h.check({}, /*need_dx=*/false));
  }
}

// ---- Batch norm ------------------------------------------------------------------------------

TEST(BatchNormGradient, NhwcActivations) {
  Harness h(make<nn::BatchNorm<double>>(), Shape{4, 3, 5}, 3);
  EXPECT_GRADIENTS_OK(h.check());
}

TEST(BatchNormGradient, FeatureMatrix) {
  Harness h(make<nn::BatchNorm<double>>(), Shape{7}, 6);
  EXPECT_GRADIENTS_OK(h.check());
}

// Inputs far from zero mean with a small spread: the normalisation must not lose them.
TEST(BatchNormGradient, OffsetInputs) {
  Harness h(make<nn::BatchNorm<double>>(), Shape{3, 3, 4}, 2);
  double* x = h.x.data<double>();
  for (int64_t i = 0; i < h.x.numel(); ++i) x[i] = 50 + 0.2 * x[i];
  EXPECT_GRADIENTS_OK(h.check());
}

TEST(BatchNormGradient, SmallestBatch) {  // two values per channel
  Harness h(make<nn::BatchNorm<double>>(), Shape{5}, 2);
  EXPECT_GRADIENTS_OK(h.check());
}

TEST(BatchNormGradient, WithFusedRelu) {
  Harness h(make<nn::BatchNorm<double>>(true), Shape{4, 3, 5}, 3);
  EXPECT_GRADIENTS_OK(h.check());
  Harness f(make<nn::BatchNorm<double>>(true), Shape{6}, 5);
  EXPECT_GRADIENTS_OK(f.check());
}

// Batch norm with a fused max pool (and with or without the fused ReLU): every cell's
// gradient is rebuilt from the pooled gradient, including cells no window covers.
struct FusedPoolCase {
  const char* name;
  int64_t h, w, c, kernel, stride, batch;
  bool relu;
};
void PrintTo(const FusedPoolCase& c, std::ostream* os) { *os << c.name; }

class BatchNormFusedPoolGradient : public ::testing::TestWithParam<FusedPoolCase> {};

TEST_P(BatchNormFusedPoolGradient, MatchesCentralDifferences) {
  const FusedPoolCase& p = GetParam();
  Harness h(make<nn::BatchNorm<double>>(p.relu, nn::FusedPool{p.kernel, p.stride}), Shape{p.h, p.w, p.c}, p.batch);
  h.x = separated_tensor(h.x.shape(), 7);  // no ties within a window
  const GradCheckReport rep = h.check();
  EXPECT_TRUE(rep.ok()) << rep.str();
  EXPECT_GT(rep.tensors[0].max_analytic, 0.01);
}

INSTANTIATE_TEST_SUITE_P(Configs, BatchNormFusedPoolGradient,
                         ::testing::Values(FusedPoolCase{"k2s2_relu", 6, 6, 3, 2, 2, 2, true},
                                           FusedPoolCase{"k2s2_odd_relu", 7, 5, 2, 2, 2, 3, true},
                                           FusedPoolCase{"k2s2_no_relu", 4, 6, 3, 2, 2, 2, false},
                                           FusedPoolCase{"k3s3_odd", 8, 7, 2, 3, 3, 2, true},
                                           FusedPoolCase{"k2s3_gaps", 8, 7, 2, 2, 3, 2, true}),
                         [](const ::testing::TestParamInfo<FusedPoolCase>& i) { return std::string(i.param.name); });

TEST(BatchNormGradient, NoDx) {
  Harness h(make<nn::BatchNorm<double>>(), Shape{3, 3, 4}, 2);
  EXPECT_GRADIENTS_OK(h.check({}, false));
}

// ---- Parameter-free layers -------------------------------------------------------------------

TEST(ReluGradient, RandomInputs) {
  Harness h(make<nn::ReLU<double>>(), Shape{3, 4, 5}, 2);
  EXPECT_GRADIENTS_OK(h.check());
}

struct PoolCase {
  const char* name;
  int64_t h, w, c, kernel, stride, batch, padding = 0;
};
void PrintTo(const PoolCase& c, std::ostream* os) { *os << c.name; }

class MaxPoolGradient : public ::testing::TestWithParam<PoolCase> {};

TEST_P(MaxPoolGradient, MatchesCentralDifferences) {
  const PoolCase& p = GetParam();
  Harness h(make<nn::MaxPool2d<double>>(p.kernel, p.stride, p.padding), Shape{p.h, p.w, p.c}, p.batch);
  h.x = separated_tensor(h.x.shape(), 99);  // no ties within a window
  const GradCheckReport rep = h.check();
  EXPECT_TRUE(rep.ok()) << rep.str();
  EXPECT_GT(rep.tensors[0].max_analytic, 0.1);
}

INSTANTIATE_TEST_SUITE_P(Configs, MaxPoolGradient,
                         ::testing::Values(PoolCase{"k2s2_even", 6, 6, 3, 2, 2, 2},
                                           PoolCase{"k2s2_odd", 7, 5, 2, 2, 2, 2},
                                           PoolCase{"k3s2_odd", 7, 7, 2, 3, 2, 2},  // overlapping windows
                                           PoolCase{"k3s2_even", 8, 6, 1, 3, 2, 2},
                                           PoolCase{"k3s1", 5, 5, 2, 3, 1, 1},
                                           PoolCase{"k2s3_gaps", 8, 7, 2, 2, 3, 2},  // cells no window sees
                                           // padded: torchvision's ResNet stem pool, odd and even sizes
                                           PoolCase{"k3s2p1_odd", 7, 7, 2, 3, 2, 2, 1},
                                           PoolCase{"k3s2p1_even", 8, 6, 1, 3, 2, 2, 1},
                                           PoolCase{"k5s1p2", 5, 4, 1, 5, 1, 1, 2}),
                         [](const ::testing::TestParamInfo<PoolCase>& i) { return std::string(i.param.name); });

TEST(GlobalAvgPoolGradient, RandomInputs) {
  Harness h(make<nn::GlobalAvgPool<double>>(), Shape{3, 4, 5}, 2);
  EXPECT_GRADIENTS_OK(h.check());
}

TEST(FlattenGradient, RandomInputs) {
  Harness h(make<nn::Flatten<double>>(), Shape{3, 4, 2}, 3);
  EXPECT_GRADIENTS_OK(h.check());
}

// ---- Linear ----------------------------------------------------------------------------------

TEST(LinearGradient, WithBias) {
  Harness h(make<nn::Linear<double>>(5, true), Shape{7}, 4);
  const GradCheckReport rep = h.check();
  EXPECT_TRUE(rep.ok()) << rep.str();
  EXPECT_EQ(rep.tensors.size(), 3u);
}

TEST(LinearGradient, WithoutBias) {
  Harness h(make<nn::Linear<double>>(6, false), Shape{9}, 3);
  const GradCheckReport rep = h.check();
  EXPECT_TRUE(rep.ok()) << rep.str();
  EXPECT_EQ(rep.tensors.size(), 2u);
}

TEST(LinearGradient, NoDx) {
  Harness h(make<nn::Linear<double>>(4, true), Shape{5}, 3);
  EXPECT_GRADIENTS_OK(h.check({}, false));
}

// ---- Composite layers ------------------------------------------------------------------------

Sequential<double> conv_bn(int64_t out, int64_t kernel, int64_t stride, int64_t pad, bool bn, bool relu) {
  Sequential<double> s;
  s.add(make<nn::Conv2d<double>>(nn::ConvSpec{out, kernel, stride, pad, !bn}));
  if (bn) s.add(make<nn::BatchNorm<double>>());
  if (relu) s.add(make<nn::ReLU<double>>());
  return s;
}

// main: conv-bn-relu-conv-bn (as a basic block); shortcut as given.
LayerPtr<double> residual(int64_t out, int64_t stride, bool bn, Sequential<double> shortcut) {
  Sequential<double> main;
  main.add(std::make_unique<Sequential<double>>(conv_bn(out, 3, stride, 1, bn, true)));
  main.add(std::make_unique<Sequential<double>>(conv_bn(out, 3, 1, 1, bn, false)));
  return std::make_unique<nn::Residual<double>>(std::move(main), std::move(shortcut));
}

TEST(ResidualGradient, IdentityShortcut) {
  for (bool bn : {true, false}) {
    Harness h(residual(4, 1, bn, {}), Shape{5, 5, 4}, 2);
    const GradCheckReport rep = h.check();
    EXPECT_TRUE(rep.ok()) << "bn=" << bn << " " << rep.str();
  }
}

TEST(ResidualGradient, ProjectionShortcut) {
  for (bool bn : {true, false}) {
    Harness h(residual(6, 2, bn, conv_bn(6, 1, 2, 0, bn, false)), Shape{6, 6, 3}, 2);
    const GradCheckReport rep = h.check();
    EXPECT_TRUE(rep.ok()) << "bn=" << bn << " " << rep.str();
    EXPECT_NE(rep.find("layer.shortcut.0.weight"), nullptr) << rep.str();
  }
}

// need_dx = false takes its own path through the block (the shortcut's input gradient is skipped).
TEST(ResidualGradient, NoDx) {
  Harness proj(residual(6, 2, true, conv_bn(6, 1, 2, 0, true, false)), Shape{6, 6, 3}, 2);
  EXPECT_GRADIENTS_OK(proj.check({}, false));
  Harness ident(residual(3, 1, false, {}), Shape{4, 4, 3}, 2);
  EXPECT_GRADIENTS_OK(ident.check({}, false));
}

LayerPtr<double> small_sequential() {
  auto s = std::make_unique<Sequential<double>>();
  s->add(make<nn::Conv2d<double>>(nn::ConvSpec{3, 3, 1, 1, true}));
  s->add(make<nn::ReLU<double>>());
  s->add(make<nn::MaxPool2d<double>>(2, 2));
  s->add(make<nn::Flatten<double>>());
  s->add(make<nn::Linear<double>>(5, false));
  s->add(make<nn::BatchNorm<double>>());
  s->add(make<nn::ReLU<double>>());
  s->add(make<nn::Linear<double>>(4, true));
  return s;
}

TEST(SequentialGradient, MixedChain) {
  Harness h(small_sequential(), Shape{6, 6, 2}, 3);
  const GradCheckReport rep = h.check();
  EXPECT_TRUE(rep.ok()) << rep.str();
  EXPECT_EQ(rep.tensors.size(), 1u + 2 + 1 + 2 + 2);  // dx, conv w+b, linear w, bn, linear w+b
}

TEST(SequentialGradient, NoDx) {
  Harness h(small_sequential(), Shape{6, 6, 1}, 3);
  EXPECT_GRADIENTS_OK(h.check({}, false));
}

// ---- Loss ------------------------------------------------------------------------------------

GradCheckReport check_softmax_cross_entropy(double smoothing, uint64_t seed) {
  const int64_t n = 4, k = 5;
  Tensor logits = random_tensor(Shape{n, k}, seed, 1, 2.0);
  std::vector<int32_t> labels{0, 3, 4, 3};
  nn::SoftmaxCrossEntropy<double> loss(smoothing);
  const double l = loss.forward(logits, labels.data());
  const Tensor& d = loss.backward();
  std::vector<Variable> vars{{"dlogits", logits.data<double>(), logits.numel(),
                              std::vector<double>(d.data<double>(), d.data<double>() + d.numel())}};
  auto objective = [&] { return loss.forward(logits, labels.data()); };
  return compare_with_central_differences(objective, vars, std::fabs(l) * n * k, {});
}

TEST(SoftmaxCrossEntropyGradient, WithoutLabelSmoothing) {
  EXPECT_GRADIENTS_OK(check_softmax_cross_entropy(0.0, 5));
}

TEST(SoftmaxCrossEntropyGradient, WithLabelSmoothing) {
  EXPECT_GRADIENTS_OK(check_softmax_cross_entropy(0.1, 6));
  EXPECT_GRADIENTS_OK(check_softmax_cross_entropy(0.5, 7));
}

// ---- Whole models ----------------------------------------------------------------------------

struct ModelCase {
  Shape input;
  int64_t batch, max_elements;
};

// Small inputs keep the double forward passes cheap; grey inputs (C = 1) run the convolutions'
// single-channel path, as Fashion-MNIST does in training.
ModelCase model_case(const std::string& name) {
  if (name == "mlp") return {Shape{6, 6, 2}, 4, 12};
  if (name == "cnn") return {Shape{8, 8, 1}, 3, 12};
  if (name == "resnet20") return {Shape{8, 8, 3}, 2, 8};
  if (name == "resnet18") return {Shape{8, 8, 1}, 3, 4};  // last stage is 1x1: batch norm sees 3 values
  return {Shape{8, 8, 3}, 3, 4};
}

class ModelGradient : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(ModelGradient, EveryParameterTensor) {
  const auto& [name, bn] = GetParam();
  const ModelCase mc = model_case(name);
  nn::ModelSpec spec;
  spec.kind = parse_named(nn::kModelNames, name, "model");
  spec.batch_norm = bn;
  spec.input = mc.input;
  spec.classes = 5;
  nn::Model<double> model(spec);
  randomize_params(model.params(), 11);
  Tensor x = random_tensor(nn::batch_shape(mc.batch, mc.input), 11, 1);
  Tensor r = random_tensor(Shape{mc.batch, spec.classes}, 11, 2);
  GradCheckOptions o;
  o.max_elements = mc.max_elements;
  const GradCheckReport rep = check_layer(model.net(), model.params(), x, r, o);
  EXPECT_TRUE(rep.ok()) << name << (bn ? "" : " (no batch norm)") << ": " << rep.str();
  EXPECT_EQ(rep.tensors.size(), model.params().slots().size() + 1);
}

// Every model but resnet50: its 23 million parameters make a double-precision check of each
// tensor minutes of CI; its bottleneck blocks are 1x1 and 3x3 convolutions, batch norm and a
// residual sum, each checked here inside resnet18 and resnet20 and on its own above.
std::vector<std::string> checked_models() {
  std::vector<std::string> names;
  for (const auto& [name, kind] : nn::kModelNames)
    if (kind != nn::ModelKind::ResNet50) names.push_back(name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(Zoo, ModelGradient,
                         ::testing::Combine(::testing::ValuesIn(checked_models()), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<std::string, bool>>& i) {
                           return std::get<0>(i.param) + (std::get<1>(i.param) ? "_bn" : "_nobn");
                         });

// Model::train_step: forward, loss (with label smoothing) and backward into the gradient arena.
TEST(ModelLossGradient, TrainStepMatchesLossDifferences) {
  nn::ModelSpec spec;
  spec.kind = nn::ModelKind::Cnn;
  spec.input = Shape{6, 6, 1};
  spec.label_smoothing = 0.1;
  nn::Model<double> model(spec);
  randomize_params(model.params(), 3);
  Tensor x = random_tensor(nn::batch_shape(4, spec.input), 3, 1);
  const std::vector<int32_t> labels{1, 9, 0, 4};
  auto& store = model.params();
  double* gp = store.grads().data<double>();
  std::fill(gp, gp + store.grads().numel(), NAN);
  const double l = model.train_step(x, labels.data());
  std::vector<Variable> vars;
  for (size_t i = 0; i < store.slots().size(); ++i) {
    const double* g = store.grad(static_cast<int>(i));
    vars.push_back({store.slots()[i].name, store.value(static_cast<int>(i)), store.slots()[i].shape.numel(),
                    std::vector<double>(g, g + store.slots()[i].shape.numel())});
  }
  auto objective = [&] { return model.loss(model.forward(x, true), labels.data()); };
  GradCheckOptions o;
  o.max_elements = 16;
  const GradCheckReport rep = compare_with_central_differences(objective, vars, 10 * l, o);
  EXPECT_TRUE(rep.ok()) << rep.str();
}

// ---- The checker itself must notice wrong gradients ------------------------------------------

// Scales the analytic element of largest magnitude of one tensor by (1 + rel).
GradCheckOptions plant(const std::string& tensor, double rel) {
  GradCheckOptions o;
  o.tamper = [tensor, rel](const std::string& name, std::vector<double>& a) {
    if (name != tensor || a.empty()) return;
    size_t at = 0;
    for (size_t i = 1; i < a.size(); ++i)
      if (std::fabs(a[i]) > std::fabs(a[at])) at = i;
    a[at] *= 1 + rel;
  };
  return o;
}

// For each tensor of several layers: a 1e-4 relative error in one element fails that tensor,
// and only that tensor.
TEST(GradCheckSensitivity, OneElementOffByOneInTenThousand) {
  std::vector<std::pair<std::string, std::function<Harness()>>> layers;
  layers.emplace_back("conv", [] { return Harness(make<nn::Conv2d<double>>(nn::ConvSpec{3, 3, 1, 1, true}), Shape{4, 4, 2}, 2); });
  layers.emplace_back("conv1", [] { return Harness(make<nn::Conv2d<double>>(nn::ConvSpec{3, 3, 2, 1, true}), Shape{5, 5, 1}, 2); });
  layers.emplace_back("batchnorm", [] { return Harness(make<nn::BatchNorm<double>>(), Shape{3, 3, 2}, 2); });
  layers.emplace_back("linear", [] { return Harness(make<nn::Linear<double>>(3, true), Shape{4}, 3); });
  for (auto& layer : layers) {
    const std::string& kind = layer.first;
    const auto& factory = layer.second;  // not a structured binding: Clang before 16 cannot capture one
    const std::vector<std::string> names = [&] {
      Harness h = factory();
      std::vector<std::string> n{"dx"};
      for (const auto& s : h.store.slots()) n.push_back(s.name);
      return n;
    }();
    for (const std::string& target : names) {
      Harness h = factory();
      const GradCheckReport rep = h.check(plant(target, 1e-4));
      EXPECT_FALSE(rep.ok()) << kind << ": planted error in " << target << " not found\n" << rep.str();
      for (const auto& t : rep.tensors)
        EXPECT_EQ(t.error <= rep.tolerance, t.name != target) << kind << "/" << t.name << "\n" << rep.str();
    }
  }
}

TEST(GradCheckSensitivity, AbsoluteErrorOfOneInHundredThousand) {
  Harness h(make<nn::Linear<double>>(3, true), Shape{4}, 3);
  double* r = h.r.data<double>();
  for (int64_t i = 0; i < h.r.numel(); ++i) r[i] *= 0.1;  // gradients of order 0.1
  GradCheckOptions o;
  o.tamper = [](const std::string& name, std::vector<double>& a) {
    if (name == "layer.weight") a[2] += 1e-5;
  };
  const GradCheckReport rep = h.check(o);
  const TensorCheck* w = rep.find("layer.weight");
  ASSERT_NE(w, nullptr);
  ASSERT_LT(w->max_analytic, 2.0) << "gradients too large for a 1e-5 error to be visible";
  EXPECT_FALSE(rep.ok()) << rep.str();
}

// y = w * x elementwise, with deliberately broken backward variants.
enum class Bug { None, DxScaled, WeightGradAccumulates, WeightGradPartlyUnwritten, WeightGradUsesOutput };

class ScaleLayer final : public nn::Layer<double> {
 public:
  explicit ScaleLayer(Bug bug) : bug_(bug) {}
  std::string kind() const override { return "scale"; }
  // A test's own kind: no GPU or ONNX form to visit.
  void accept(nn::LayerVisitor<double>&) const override { throw Error(ErrorKind::Internal, "scale: no visitor"); }
  Shape setup(const Shape& in, ParamStore<double>& store, const std::string& prefix) override {
    store_ = &store;
    w_ = store.add_param(prefix + ".weight", in, ParamRole::Weight, 1);
    n_ = in.numel();
    return in;
  }
  const Tensor& forward(const Tensor& x, bool) override {
    x_ = x;
    y_.resize<double>(x.shape());
    const double* w = store_->value(w_);
    for (int64_t i = 0; i < x.numel(); ++i) y_.data<double>()[i] = w[i % n_] * x.data<double>()[i];
    return y_;
  }
  const Tensor& backward(const Tensor& dy, bool need_dx) override {
    const double* w = store_->value(w_);
    double* dw = store_->grad(w_);
    const double* g = dy.data<double>();
    const double* src = bug_ == Bug::WeightGradUsesOutput ? y_.data<double>() : x_.data<double>();
    const int64_t written = bug_ == Bug::WeightGradPartlyUnwritten ? n_ - 1 : n_;
    if (bug_ != Bug::WeightGradAccumulates) std::fill(dw, dw + written, 0.0);
    for (int64_t i = 0; i < dy.numel(); ++i)
      if (i % n_ < written) dw[i % n_] += g[i] * src[i];
    if (need_dx) {
      dx_.resize<double>(dy.shape());
      for (int64_t i = 0; i < dy.numel(); ++i) dx_.data<double>()[i] = g[i] * w[i % n_];
      if (bug_ == Bug::DxScaled) dx_.data<double>()[1] *= 1 + 1e-4;
    }
    return dx_;
  }

 private:
  Bug bug_;
  ParamStore<double>* store_ = nullptr;
  int w_ = -1;
  int64_t n_ = 0;
  Tensor x_, y_, dx_;
};

TEST(GradCheckSensitivity, BrokenLayers) {
  auto run = [](Bug bug) {
    Harness h(std::make_unique<ScaleLayer>(bug), Shape{2, 3, 2}, 2);
    return h.check();
  };
  const GradCheckReport good = run(Bug::None);
  EXPECT_TRUE(good.ok()) << good.str();
  for (Bug bug : {Bug::DxScaled, Bug::WeightGradAccumulates, Bug::WeightGradPartlyUnwritten,
                  Bug::WeightGradUsesOutput}) {
    const GradCheckReport rep = run(bug);
    EXPECT_FALSE(rep.ok()) << "bug " << static_cast<int>(bug) << " not detected\n" << rep.str();
  }
}

}  // namespace
}  // namespace hpc::testing

// SGD against hand-computed and reference updates; learning-rate schedules.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "core/arena.hpp"
#include "core/error.hpp"
#include "core/rng.hpp"
#include "optim/loss_scaler.hpp"
#include "optim/schedule.hpp"
#include "optim/sgd.hpp"

namespace hpc {
namespace {

using optim::LrSchedule;
using optim::ScheduleSpec;
using optim::Sgd;
using optim::SgdSpec;

ErrorKind error_kind(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.kind();
  }
  ADD_FAILURE() << "no hpc::Error thrown";
  return ErrorKind::Internal;
}

// ---- SGD: three steps worked by hand ---------------------------------------------------------

// One weight and one bias element, both starting at 1, gradients 0.5, -0.2, 0.1;
// lr 0.1, momentum 0.9, weight decay 0.01 (torch.optim.SGD semantics):
//   g' = g + wd p;  v = mu v + g';  p -= lr (nesterov ? g' + mu v : v)
struct HandCase {
  bool nesterov, decay_all;
  double weight[3], bias[3];
};
void PrintTo(const HandCase& c, std::ostream* os) { *os << (c.nesterov ? "nesterov" : "classical") << (c.decay_all ? ", decay all" : ""); }

class SgdByHand : public ::testing::TestWithParam<HandCase> {};

TEST_P(SgdByHand, ThreeSteps) {
  const HandCase& c = GetParam();
  ParamStore<double> store;
  const int w = store.add_param("w", Shape{1}, ParamRole::Weight);
  const int b = store.add_param("b", Shape{1}, ParamRole::Bias);
  store.allocate();
  *store.value(w) = *store.value(b) = 1.0;
  Sgd<double> sgd(store, SgdSpec{0.9, c.nesterov, 0.01, c.decay_all});
  const double grads[3] = {0.5, -0.2, 0.1};
  for (int s = 0; s < 3; ++s) {
    *store.grad(w) = *store.grad(b) = grads[s];
    sgd.step(store, 0.1);
    EXPECT_NEAR(*store.value(w), c.weight[s], 1e-12) << "step " << s + 1;
    EXPECT_NEAR(*store.value(b), c.bias[s], 1e-12) << "step " << s + 1;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Variants, SgdByHand,
    ::testing::Values(
        // Nesterov; the bias is not decayed.
        HandCase{true, false, {0.9031, 0.89807411, 0.855657258191}, {0.905, 0.9025, 0.86325}},
        // Classical momentum; the bias is not decayed.
        HandCase{false, false, {0.949, 0.922151, 0.887064749}, {0.95, 0.925, 0.8925}},
        // Nesterov with decay on biases too: both follow the weight's path.
        HandCase{true, true, {0.9031, 0.89807411, 0.855657258191}, {0.9031, 0.89807411, 0.855657258191}}),
    [](const ::testing::TestParamInfo<HandCase>& i) {
      return std::string(i.param.nesterov ? "nesterov" : "classical") + (i.param.decay_all ? "_decay_all" : "");
    });

// ---- SGD: every role, odd tensor sizes, against a per-element reference ----------------------

struct RefParam {
  ParamRole role;
  std::vector<double> p, v;
};

void reference_step(std::vector<RefParam>& params, const std::vector<std::vector<double>>& grads,
                    const SgdSpec& spec, double lr) {
  for (size_t t = 0; t < params.size(); ++t) {
    RefParam& rp = params[t];
    const bool decay = rp.role == ParamRole::Weight || spec.decay_bias_and_norm;
    for (size_t i = 0; i < rp.p.size(); ++i) {
      const double g = grads[t][i] + (decay ? spec.weight_decay * rp.p[i] : 0.0);
      rp.v[i] = spec.momentum * rp.v[i] + g;
      rp.p[i] -= lr * (spec.nesterov ? g + spec.momentum * rp.v[i] : rp.v[i]);
    }
  }
}

// mus: the momentum of each of the three steps (a schedule may cycle it); empty: spec's.
template <class T>
void compare_with_reference(const SgdSpec& spec, double tol, std::vector<double> mus = {}) {
  const std::vector<std::pair<ParamRole, int64_t>> layout{
      {ParamRole::Weight, 7}, {ParamRole::Bias, 3}, {ParamRole::NormScale, 5}, {ParamRole::NormShift, 5},
      {ParamRole::Weight, 17}, {ParamRole::Bias, 1}};
  ParamStore<T> store;
  for (size_t i = 0; i < layout.size(); ++i)
    store.add_param("p" + std::to_string(i), Shape{layout[i].second}, layout[i].first);
  store.allocate();
  std::vector<RefParam> ref;
  Philox rng(1, RngStream::Test);
  for (size_t i = 0; i < layout.size(); ++i) {
    RefParam rp{layout[i].first, std::vector<double>(layout[i].second), std::vector<double>(layout[i].second, 0)};
    for (auto& x : rp.p) x = static_cast<T>(rng.normal());  // representable in T
    std::copy(rp.p.begin(), rp.p.end(), store.value(static_cast<int>(i)));
    ref.push_back(rp);
  }
  Sgd<T> sgd(store, spec);
  const double lrs[3] = {0.1, 0.05, 0.2};
  for (int s = 0; s < 3; ++s) {
    std::vector<std::vector<double>> grads;
    for (size_t i = 0; i < layout.size(); ++i) {
      std::vector<double> g(layout[i].second);
      for (auto& x : g) x = static_cast<T>(rng.normal());
      std::copy(g.begin(), g.end(), store.grad(static_cast<int>(i)));
      grads.push_back(g);
    }
    if (mus.empty()) {
      sgd.step(store, lrs[s]);
      reference_step(ref, grads, spec, lrs[s]);
    } else {
      sgd.step(store, lrs[s], mus[s]);
      SgdSpec with_mu = spec;
      with_mu.momentum = mus[s];
      reference_step(ref, grads, with_mu, lrs[s]);
    }
    for (size_t i = 0; i < layout.size(); ++i)
      for (int64_t j = 0; j < layout[i].second; ++j) {
        ASSERT_NEAR(store.value(static_cast<int>(i))[j], ref[i].p[j], tol)
            << "step " << s + 1 << " tensor " << i << " element " << j;
        ASSERT_NEAR(sgd.momentum_buffer().template data<T>()[store.slots()[i].offset + j], ref[i].v[j], tol);
      }
  }
  // The alignment padding between tensors is no parameter: it stays zero.
  const T* all = store.values().template data<T>();
  for (size_t i = 0; i + 1 < layout.size(); ++i)
    for (int64_t k = store.slots()[i].offset + layout[i].second; k < store.slots()[i + 1].offset; ++k)
      EXPECT_EQ(all[k], T(0));
}

TEST(SgdReference, DoubleAllVariants) {
  for (bool nesterov : {true, false})
    for (bool decay_all : {false, true})
      for (double wd : {0.0, 5e-4, 0.1}) {
        SCOPED_TRACE(::testing::Message() << "nesterov " << nesterov << " decay_all " << decay_all << " wd " << wd);
        compare_with_reference<double>(SgdSpec{0.9, nesterov, wd, decay_all}, 1e-13);
      }
}

// A momentum given per step (one-cycle cycles it) replaces the spec's for that step only.
TEST(SgdReference, MomentumPerStep) {
  for (bool nesterov : {true, false}) {
    SCOPED_TRACE(nesterov ? "nesterov" : "classical");
    compare_with_reference<double>(SgdSpec{0.9, nesterov, 5e-4, false}, 1e-13, {0.95, 0.85, 0.9});
  }
}

TEST(SgdReference, PlainSgdWithoutMomentum) {
  compare_with_reference<double>(SgdSpec{0.0, false, 0.01, false}, 1e-13);
}

TEST(SgdReference, FloatFollowsTheDoubleReference) {
  compare_with_reference<float>(SgdSpec{0.9, true, 0.1, false}, 2e-6);
  compare_with_reference<float>(SgdSpec{0.8, false, 0.1, true}, 2e-6);
}

TEST(SgdSpecValidation, RejectsBadSettings) {
  ParamStore<double> store;
  store.add_param("w", Shape{2}, ParamRole::Weight);
  store.allocate();
  EXPECT_EQ(error_kind([&] { Sgd<double>(store, SgdSpec{1.0, true, 0, false}); }), ErrorKind::Usage);
  EXPECT_EQ(error_kind([&] { Sgd<double>(store, SgdSpec{-0.1, false, 0, false}); }), ErrorKind::Usage);
  EXPECT_EQ(error_kind([&] { Sgd<double>(store, SgdSpec{0.9, true, -1e-4, false}); }), ErrorKind::Usage);
  EXPECT_EQ(error_kind([&] { Sgd<double>(store, SgdSpec{0.0, true, 0, false}); }), ErrorKind::Usage);
}

// ---- Learning-rate schedules -----------------------------------------------------------------

ScheduleSpec spec_of(const std::string& kind, double lr = 0.4, double total = 1000) {
  ScheduleSpec s;
  s.kind = parse_named(optim::kScheduleNames, kind, "--lr-schedule");
  s.lr = lr;
  s.total_samples = total;
  return s;
}

TEST(LrSchedule, Constant) {
  LrSchedule s(spec_of("constant"));
  for (double x : {0.0, 1.0, 500.0, 1000.0, 5000.0}) EXPECT_DOUBLE_EQ(s.lr(x), 0.4);
}

TEST(LrSchedule, StepMultipliesByGammaAtEachMilestone) {
  ScheduleSpec spec = spec_of("step");
  spec.step_samples = {600, 300};  // unsorted on purpose
  spec.gamma = 0.5;
  LrSchedule s(spec);
  EXPECT_DOUBLE_EQ(s.lr(0), 0.4);
  EXPECT_DOUBLE_EQ(s.lr(299.9), 0.4);
  EXPECT_DOUBLE_EQ(s.lr(300), 0.2);
  EXPECT_DOUBLE_EQ(s.lr(599), 0.2);
  EXPECT_DOUBLE_EQ(s.lr(600), 0.1);
  EXPECT_DOUBLE_EQ(s.lr(10000), 0.1);
}

TEST(LrSchedule, CosineFromLrToMinLr) {
  ScheduleSpec spec = spec_of("cosine");
  spec.min_lr = 0.01;
  LrSchedule s(spec);
  EXPECT_DOUBLE_EQ(s.lr(0), 0.4);
  EXPECT_NEAR(s.lr(500), (0.4 + 0.01) / 2, 1e-15);
  EXPECT_NEAR(s.lr(250), 0.01 + 0.39 * 0.5 * (1 + std::cos(M_PI / 4)), 1e-15);
  EXPECT_NEAR(s.lr(1000), 0.01, 1e-15);
  EXPECT_NEAR(s.lr(2000), 0.01, 1e-15);  // clamped past the end
  for (double x = 10; x <= 1000; x += 10) EXPECT_LE(s.lr(x), s.lr(x - 10));
}

TEST(LrSchedule, OneCycleAsPyTorch) {
  ScheduleSpec spec = spec_of("onecycle", 0.5, 1000);
  spec.pct_start = 0.25;
  spec.div_factor = 25;
  spec.final_div_factor = 1e4;
  LrSchedule s(spec);
  const double initial = 0.5 / 25, final_lr = initial / 1e4;
  EXPECT_NEAR(s.lr(0), initial, 1e-15);
  EXPECT_NEAR(s.lr(125), (initial + 0.5) / 2, 1e-15);  // halfway up (cosine)
  EXPECT_NEAR(s.lr(250), 0.5, 1e-15);                  // the peak at pct_start
  EXPECT_NEAR(s.lr(625), (0.5 + final_lr) / 2, 1e-15);  // halfway down
  EXPECT_NEAR(s.lr(1000), final_lr, 1e-18);
  for (double x = 10; x <= 250; x += 10) EXPECT_GT(s.lr(x), s.lr(x - 10)) << x;
  for (double x = 260; x <= 1000; x += 10) EXPECT_LT(s.lr(x), s.lr(x - 10)) << x;
}

// With the samples of a step given, the lr and momentum of every step are PyTorch's own:
// OneCycleLR(max_lr=0.5, total_steps=10, pct_start=0.25, base_momentum=0.8,
// max_momentum=0.96), read from its optimizer before each step (python3-torch 1.13). Its
// peak is at step pct_start*T - 1 = 1.5 and its floor at the last step, T - 1.
TEST(LrSchedule, OneCycleStepsAsPyTorch) {
  ScheduleSpec spec = spec_of("onecycle", 0.5, 30);
  spec.samples_per_step = 3;
  spec.pct_start = 0.25;
  spec.base_momentum = 0.8;
  spec.max_momentum = 0.96;
  LrSchedule s(spec);
  const double lr[] = {0.020000000000000018, 0.37999999999999995, 0.4945369220358507, 0.4522544395767425,
                       0.3750005,            0.27613301128845014, 0.17274706042325755, 0.08271901754089188,
                       0.021615549134807396, 2e-06};
  const double momentum[] = {0.96, 0.8400000000000001, 0.8017481919412957, 0.8152786404500042,
                             0.8400000000000001, 0.8716377229385878, 0.9047213595499958, 0.9335304485087086,
                             0.953083636611408, 0.96};
  for (int k = 0; k < 10; ++k) {
    EXPECT_NEAR(s.lr(3.0 * k), lr[k], 1e-15) << "step " << k;
    EXPECT_NEAR(s.momentum(3.0 * k, 0.5), momentum[k], 1e-15) << "step " << k;
  }
  // A rising phase that ends at the first step (pct_start * T = 1) is skipped: the peak first.
  spec.total_samples = 12;  // 4 steps, the rise ending at step 0.25 * 4 - 1 = 0
  LrSchedule short_rise(spec);
  EXPECT_NEAR(short_rise.lr(0), 0.5, 1e-15);
  EXPECT_NEAR(short_rise.lr(9), 0.5 / 25 / 1e4, 1e-18);
}

// PyTorch's OneCycleLR with cycle_momentum: max -> base while the lr rises, back to max as it
// falls (cosine both ways); other schedules, or cycling off, keep the fixed momentum.
TEST(LrSchedule, OneCycleCyclesMomentumInversely) {
  ScheduleSpec spec = spec_of("onecycle", 0.5, 1000);
  spec.pct_start = 0.25;
  spec.base_momentum = 0.8;
  spec.max_momentum = 0.96;
  LrSchedule s(spec);
  EXPECT_NEAR(s.momentum(0, 0.5), 0.96, 1e-15);
  EXPECT_NEAR(s.momentum(125, 0.5), 0.88, 1e-15);
  EXPECT_NEAR(s.momentum(250, 0.5), 0.8, 1e-15);
  EXPECT_NEAR(s.momentum(625, 0.5), 0.88, 1e-15);
  EXPECT_NEAR(s.momentum(1000, 0.5), 0.96, 1e-15);
  EXPECT_NEAR(s.momentum(5000, 0.5), 0.96, 1e-15);
  for (double x = 10; x <= 1000; x += 10) {
    // Inverse to the lr: one goes up exactly when the other goes down.
    const double dl = s.lr(x) - s.lr(x - 10), dm = s.momentum(x, 0.5) - s.momentum(x - 10, 0.5);
    EXPECT_LT(dl * dm, 0) << x;
  }
  spec.cycle_momentum = false;
  LrSchedule fixed(spec);
  EXPECT_EQ(fixed.momentum(125, 0.7), 0.7);
  for (const char* kind : {"constant", "step", "cosine"}) {
    ScheduleSpec other = spec_of(kind);
    other.step_samples = {500};
    EXPECT_EQ(LrSchedule(other).momentum(300, 0.7), 0.7) << kind;
  }
}

TEST(LrSchedule, WarmupRisesLinearlyFromZero) {
  ScheduleSpec spec = spec_of("constant");
  spec.warmup_samples = 200;
  LrSchedule s(spec);
  EXPECT_DOUBLE_EQ(s.lr(0), 0.0);
  EXPECT_DOUBLE_EQ(s.lr(50), 0.1);
  EXPECT_DOUBLE_EQ(s.lr(100), 0.2);
  EXPECT_DOUBLE_EQ(s.lr(200), 0.4);
  EXPECT_DOUBLE_EQ(s.lr(600), 0.4);
  // Warm-up scales whatever the schedule gives at that point.
  ScheduleSpec cos = spec_of("cosine");
  cos.warmup_samples = 200;
  LrSchedule c(cos), plain(spec_of("cosine"));
  EXPECT_NEAR(c.lr(100), 0.5 * plain.lr(100), 1e-15);
  EXPECT_DOUBLE_EQ(c.lr(300), plain.lr(300));
}

TEST(LrSchedule, EveryNameIsAccepted) {
  for (const auto& [name, kind] : optim::kScheduleNames) {
    ScheduleSpec spec = spec_of(name);
    spec.step_samples = {500};
    LrSchedule s(spec);
    EXPECT_GT(s.lr(10), 0) << name;
  }
}

TEST(LrSchedule, BadSpecsAreUsageErrors) {
  auto with = [](const std::function<void(ScheduleSpec&)>& change) {
    return [change] {
      ScheduleSpec s = spec_of("onecycle");
      change(s);
      LrSchedule sched(s);
    };
  };
  EXPECT_EQ(error_kind([] { spec_of("nope"); }), ErrorKind::Usage);
  EXPECT_EQ(error_kind([] { spec_of(""); }), ErrorKind::Usage);
  EXPECT_EQ(error_kind(with([](ScheduleSpec& s) { s.lr = 0; })), ErrorKind::Usage);
  EXPECT_EQ(error_kind(with([](ScheduleSpec& s) { s.lr = -1; })), ErrorKind::Usage);
  EXPECT_EQ(error_kind(with([](ScheduleSpec& s) { s.lr = NAN; })), ErrorKind::Usage);
  EXPECT_EQ(error_kind(with([](ScheduleSpec& s) { s.lr = INFINITY; })), ErrorKind::Usage);
  EXPECT_EQ(error_kind(with([](ScheduleSpec& s) { s.warmup_samples = -1; })), ErrorKind::Usage);
  EXPECT_EQ(error_kind(with([](ScheduleSpec& s) { s.pct_start = 0; })), ErrorKind::Usage);
  EXPECT_EQ(error_kind(with([](ScheduleSpec& s) { s.pct_start = 1; })), ErrorKind::Usage);
  EXPECT_EQ(error_kind(with([](ScheduleSpec& s) { s.div_factor = 0.5; })), ErrorKind::Usage);
  EXPECT_EQ(error_kind(with([](ScheduleSpec& s) { s.final_div_factor = 0; })), ErrorKind::Usage);
  EXPECT_EQ(error_kind(with([](ScheduleSpec& s) { s.gamma = 0; })), ErrorKind::Usage);
  EXPECT_EQ(error_kind(with([](ScheduleSpec& s) { s.base_momentum = 0.96; })), ErrorKind::Usage);  // above max
  EXPECT_EQ(error_kind(with([](ScheduleSpec& s) { s.max_momentum = 1.0; })), ErrorKind::Usage);
  EXPECT_EQ(error_kind(with([](ScheduleSpec& s) { s.base_momentum = -0.1; })), ErrorKind::Usage);
  // And a good one does not throw.
  EXPECT_NO_THROW(LrSchedule(spec_of("onecycle")));
}

}  // namespace
}  // namespace hpc

namespace hpc::optim {
namespace {

// PyTorch's GradScaler schedule: halve and skip on an overflow, double after `interval` finite
// steps in a row, an overflow restarting the count.
TEST(LossScaler, HalvesOnOverflowAndGrowsAfterTheInterval) {
  LossScaler s({}, 3);
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_TRUE(s.update(true));
  EXPECT_TRUE(s.update(true));
  EXPECT_FALSE(s.update(false));  // skipped: the count starts again
  EXPECT_EQ(s.scale(), 32768.0);
  EXPECT_EQ(s.state().good_steps, 0);
  EXPECT_TRUE(s.update(true));
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 32768.0);
  EXPECT_TRUE(s.update(true));  // the third finite step in a row
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_EQ(s.state().good_steps, 0);
  EXPECT_EQ(s.state().skipped, 1);
}

TEST(LossScaler, NeverFallsBelowOneAndResumesFromItsState) {
  LossScaler s({4.0, 0, 0}, 2000);
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 1.0);
  EXPECT_EQ(s.state().skipped, 5);
  // A scaler made from a saved state carries on exactly where that one stood.
  LossScaler a({1024.0, 1998, 7}, 2000), b(a.state(), 2000);
  for (LossScaler* x : {&a, &b}) {
    x->update(true);
    x->update(true);
  }
  EXPECT_EQ(a.scale(), 2048.0);
  EXPECT_EQ(b.scale(), a.scale());
  EXPECT_EQ(b.state().skipped, 7);
}

}  // namespace
}  // namespace hpc::optim

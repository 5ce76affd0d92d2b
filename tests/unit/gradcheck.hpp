// Finite-difference gradient checks, in double, on the CPU (DESIGN.md, "Tests, in layers").
//
// A layer is checked through the scalar objective f(x, params) = sum(r * layer.forward(x)),
// with r fixed random "upstream" weights, so backward(r) must equal df/dx and df/dparams.
// Each checked element is compared with the central difference (f(v+eps) - f(v-eps)) / 2eps.
//
// Error of one tensor: max|a - n| / max(floor, max|a| + max|n|), a analytic, n numeric, over
// the checked elements. The floor keeps tensors whose true gradient is zero (a bias in front
// of a batch norm) from dividing rounding noise by nothing: the numeric derivative carries an
// absolute error of about ulp(f)/eps, so a tensor is compared absolutely once its gradients
// are at that level (see noise_floor()).
//
// The checker also enforces the backward contract of layer.hpp: parameter gradients are
// OVERWRITTEN, so the gradient arena is filled with NaN before backward, and a second
// forward + backward must reproduce the first bit for bit.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "core/arena.hpp"
#include "core/rng.hpp"
#include "core/tensor.hpp"
#include "nn/layer.hpp"

namespace hpc::testing {

struct GradCheckOptions {
  double eps = 1e-6;
  double tolerance = 1e-6;
  // At most this many elements of each tensor are checked (a random subset); 0: all.
  int64_t max_elements = 0;
  uint64_t seed = 1234;
  // Test hook: may alter the analytic gradient of tensor `name` before the comparison (to
  // prove that the checker notices a wrong gradient).
  std::function<void(const std::string& name, std::vector<double>& analytic)> tamper;
};

struct TensorCheck {
  std::string name;
  int64_t checked = 0;
  double max_analytic = 0, max_numeric = 0, max_diff = 0, error = 0;
  int64_t worst_index = -1;
  double worst_analytic = 0, worst_numeric = 0;
};

struct GradCheckReport {
  std::vector<TensorCheck> tensors;
  double tolerance = 0, floor = 0;
  bool repeatable = true;  // second forward + backward reproduced the first bit for bit
  std::string repeat_problem;

  // NaN (e.g. a gradient the layer left unwritten) compares as a failure.
  bool ok() const {
    if (!repeatable) return false;
    for (const auto& t : tensors)
      if (!(t.error <= tolerance)) return false;
    return !tensors.empty();
  }
  double worst_error() const {
    double w = 0;
    for (const auto& t : tensors) w = std::isnan(t.error) || std::isnan(w) ? NAN : std::max(w, t.error);
    return w;
  }
  const TensorCheck* find(const std::string& name) const {
    for (const auto& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
  std::string str() const {
    std::ostringstream os;
    os.precision(3);
    os << "gradient check (tolerance " << tolerance << ", floor " << floor << ")";
    if (!repeatable) os << "\n  NOT REPEATABLE: " << repeat_problem;
    for (const auto& t : tensors) {
      os << "\n  " << (t.error <= tolerance ? "ok  " : "FAIL") << " " << t.name << ": error " << t.error << " over "
         << t.checked << " elements, max|analytic| " << t.max_analytic << ", max|numeric| " << t.max_numeric;
      if (!(t.error <= tolerance))
        os << "; worst element " << t.worst_index << ": analytic " << t.worst_analytic << " numeric "
           << t.worst_numeric;
    }
    return os.str();
  }
};

// Normal random values, from the test stream of the counter-based generator.
inline void fill_normal(double* p, int64_t n, uint64_t seed, uint64_t which, double scale = 1.0, double shift = 0) {
  Philox rng(seed, RngStream::Test, which);
  for (int64_t i = 0; i < n; ++i) p[i] = shift + scale * rng.normal();
}

inline Tensor random_tensor(const Shape& shape, uint64_t seed, uint64_t which, double scale = 1.0) {
  Tensor t = Tensor::zeros<double>(shape);
  fill_normal(t.data<double>(), t.numel(), seed, which, scale);
  return t;
}

// A tensor of the given shape whose values are pairwise at least `gap` apart (a shuffled
// ramp plus a little noise): max pooling then has no ties for a finite difference to cross.
inline Tensor separated_tensor(const Shape& shape, uint64_t seed, double gap = 1e-2) {
  Tensor t = Tensor::zeros<double>(shape);
  const auto perm = epoch_permutation(seed, 0, static_cast<uint32_t>(t.numel()));
  double* p = t.data<double>();
  const double centre = 0.5 * static_cast<double>(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = gap * (static_cast<double>(perm[i]) - centre);
  return t;
}

// Indices of the elements to check: all, or a random subset that always contains the first
// and the last element.
inline std::vector<int64_t> pick_elements(int64_t n, int64_t max_elements, uint64_t seed, uint64_t which) {
  std::vector<int64_t> idx;
  if (max_elements <= 0 || n <= max_elements) {
    idx.resize(n);
    for (int64_t i = 0; i < n; ++i) idx[i] = i;
    return idx;
  }
  auto perm = epoch_permutation(seed, which, static_cast<uint32_t>(n));
  idx.assign(perm.begin(), perm.begin() + max_elements);
  idx[0] = 0;
  idx[1] = n - 1;
  std::sort(idx.begin(), idx.end());
  idx.erase(std::unique(idx.begin(), idx.end()), idx.end());
  return idx;
}

// Absolute error of a central difference of f whose terms have total magnitude `scale`:
// each evaluation rounds at about eps_machine * scale, divided by 2 eps. The floor is that
// noise over the tolerance, times a safety factor of 10: pure noise then scores <= tol / 10.
inline double noise_floor(double scale, const GradCheckOptions& o) {
  const double noise = std::numeric_limits<double>::epsilon() * std::max(scale, 1.0) / o.eps;
  return std::max(1e-8, 10 * noise / o.tolerance);
}

// One variable of an objective: its values (perturbed in place) and the analytic gradient.
struct Variable {
  std::string name;
  double* values;
  int64_t count;
  std::vector<double> analytic;  // count entries
};

// Compares analytic gradients with central differences of `objective` for every variable.
inline GradCheckReport compare_with_central_differences(const std::function<double()>& objective,
                                                        std::vector<Variable>& vars, double scale,
                                                        const GradCheckOptions& o) {
  GradCheckReport report;
  report.tolerance = o.tolerance;
  report.floor = noise_floor(scale, o);
  for (size_t v = 0; v < vars.size(); ++v) {
    Variable& var = vars[v];
    if (o.tamper) o.tamper(var.name, var.analytic);
    TensorCheck tc;
    tc.name = var.name;
    const auto idx = pick_elements(var.count, o.max_elements, o.seed, v + 1);
    std::vector<double> numeric(idx.size());
    for (size_t k = 0; k < idx.size(); ++k) {
      double& x = var.values[idx[k]];
      const double saved = x;
      x = saved + o.eps;
      const double fp = objective();
      x = saved - o.eps;
      const double fm = objective();
      x = saved;
      numeric[k] = (fp - fm) / (2 * o.eps);
    }
    bool nan = false;
    for (size_t k = 0; k < idx.size(); ++k) {
      const double a = var.analytic[idx[k]], n = numeric[k], d = std::fabs(a - n);
      nan = nan || std::isnan(a) || std::isnan(n);
      tc.max_analytic = std::max(tc.max_analytic, std::fabs(a));
      tc.max_numeric = std::max(tc.max_numeric, std::fabs(n));
      if (d > tc.max_diff || tc.worst_index < 0) {
        tc.max_diff = std::max(tc.max_diff, d);
        tc.worst_index = idx[k];
        tc.worst_analytic = a;
        tc.worst_numeric = n;
      }
    }
    tc.checked = static_cast<int64_t>(idx.size());
    tc.error = nan ? NAN : tc.max_diff / std::max(report.floor, tc.max_analytic + tc.max_numeric);
    report.tensors.push_back(tc);
  }
  // HPCTRAIN_GRADCHECK_VERBOSE=1 prints every report: how far from the tolerance each is.
  if (const char* v = std::getenv("HPCTRAIN_GRADCHECK_VERBOSE"); v && *v == '1') std::printf("%s\n", report.str().c_str());
  return report;
}

inline double weighted_sum(const Tensor& y, const Tensor& r) {
  const double* yp = y.data<double>();
  const double* rp = r.data<double>();
  double s = 0;
  for (int64_t i = 0; i < y.numel(); ++i) s += rp[i] * yp[i];
  return s;
}

// Copies of a layer's dx (if wanted) and of every parameter gradient after one forward +
// backward(r) with the gradient arena poisoned by NaN beforehand.
struct AnalyticGradients {
  std::vector<double> dx;
  std::vector<std::vector<double>> params;
  double objective = 0, scale = 0;
};

inline AnalyticGradients analytic_gradients(nn::Layer<double>& layer, ParamStore<double>& store, const Tensor& x,
                                            const Tensor& r, bool need_dx) {
  AnalyticGradients g;
  const Tensor& y = layer.forward(x, true);
  HPC_CHECK(y.shape() == r.shape(), "upstream weights ", r.shape().str(), " for output ", y.shape().str());
  g.objective = weighted_sum(y, r);
  for (int64_t i = 0; i < y.numel(); ++i) g.scale += std::fabs(r.data<double>()[i] * y.data<double>()[i]);
  if (store.grads().defined()) {
    double* gp = store.grads().data<double>();
    std::fill(gp, gp + store.grads().numel(), std::numeric_limits<double>::quiet_NaN());
  }
  const Tensor& dx = layer.backward(r, need_dx);
  if (need_dx) {
    HPC_CHECK(dx.shape() == x.shape(), "dx ", dx.shape().str(), " for input ", x.shape().str());
    g.dx.assign(dx.data<double>(), dx.data<double>() + dx.numel());
  }
  for (size_t i = 0; i < store.slots().size(); ++i) {
    const double* p = store.grad(static_cast<int>(i));
    g.params.emplace_back(p, p + store.slots()[i].shape.numel());
  }
  return g;
}

inline bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
}

// Checks dx (when need_dx) and every parameter gradient of `layer`, whose parameters live in
// `store` (allocated). x is perturbed in place during the check and restored.
inline GradCheckReport check_layer(nn::Layer<double>& layer, ParamStore<double>& store, Tensor& x, const Tensor& r,
                                   const GradCheckOptions& o = {}, bool need_dx = true) {
  AnalyticGradients first = analytic_gradients(layer, store, x, r, need_dx);
  AnalyticGradients second = analytic_gradients(layer, store, x, r, need_dx);
  std::string repeat_problem;
  if (!same_bits(first.dx, second.dx)) repeat_problem = "dx differs between two identical backward passes";
  for (size_t i = 0; i < first.params.size() && repeat_problem.empty(); ++i)
    if (!same_bits(first.params[i], second.params[i]))
      repeat_problem = "gradient of " + store.slots()[i].name + " differs between two identical backward passes";

  std::vector<Variable> vars;
  if (need_dx) vars.push_back({"dx", x.data<double>(), x.numel(), std::move(first.dx)});
  for (size_t i = 0; i < store.slots().size(); ++i)
    vars.push_back({store.slots()[i].name, store.value(static_cast<int>(i)), store.slots()[i].shape.numel(),
                    std::move(first.params[i])});
  auto objective = [&] { return weighted_sum(layer.forward(x, true), r); };
  GradCheckReport report = compare_with_central_differences(objective, vars, first.scale, o);
  report.repeatable = repeat_problem.empty();
  report.repeat_problem = repeat_problem;
  return report;
}

// Random values for every parameter of a store: weights ~ N(0, 1/fan_in) (activations stay
// of order one through deep stacks), everything else ~ N(shift, 0.3) so that biases and
// batch-norm parameters are neither zero nor one (no special case hides a wrong gradient).
inline void randomize_params(ParamStore<double>& store, uint64_t seed) {
  const auto& slots = store.slots();
  for (size_t i = 0; i < slots.size(); ++i) {
    const ParamSlot& s = slots[i];
    double* p = store.value(static_cast<int>(i));
    const int64_t n = s.shape.numel();
    switch (s.role) {
      case ParamRole::Weight:
        fill_normal(p, n, seed, 1000 + i, std::sqrt(1.0 / static_cast<double>(std::max<int64_t>(s.fan_in, 1))));
        break;
      case ParamRole::NormScale: fill_normal(p, n, seed, 1000 + i, 0.3, 1.0); break;
      case ParamRole::Bias:
      case ParamRole::NormShift: fill_normal(p, n, seed, 1000 + i, 0.3); break;
    }
  }
}

}  // namespace hpc::testing

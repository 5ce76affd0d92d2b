// Batch normalisation over the channel (last) dimension: NHWC activations are an M x C
// matrix with M = N*H*W, and N x F features are the same with M = N. An optional ReLU is
// fused in (one pass over memory fewer each way, and the activations of these small models
// do not fit in L2).
//
// Statistics: blocks of kBlock rows are summed in T (vectorised), blocks and threads are
// combined in double. Values are taken relative to the first row (a shift), so the one-pass
// variance E[(x-K)^2] - E[x-K]^2 does not cancel catastrophically.
#include <cmath>

#include "nn/layer.hpp"
#include "nn/parallel.hpp"

namespace hpc::nn {
namespace {
constexpr int64_t kBlock = 64;
constexpr int kMaxParts = 64;
constexpr int64_t kMinRowsPerPart = 512;

// Sums over rows [b, e) of f(row, j) into out1/out2 (double, c entries each).
template <class T, class F>
void blocked_sums(int64_t b, int64_t e, int64_t c, double* out1, double* out2, F&& f) {
  std::vector<T> s1(c), s2(c);
  for (int64_t r0 = b; r0 < e; r0 += kBlock) {
    std::fill(s1.begin(), s1.end(), T(0));
    std::fill(s2.begin(), s2.end(), T(0));
    const int64_t r1 = std::min(e, r0 + kBlock);
    for (int64_t r = r0; r < r1; ++r) f(r, s1.data(), s2.data());
    for (int64_t j = 0; j < c; ++j) {
      out1[j] += s1[j];
      out2[j] += s2[j];
    }
  }
}

}  // namespace

template <class T>
Shape BatchNorm<T>::setup(const Shape& in, ParamStore<T>& store, const std::string& prefix) {
  c_ = in[in.rank() - 1];
  store_ = &store;
  gamma_ = store.add_param(prefix + ".weight", Shape{c_}, ParamRole::NormScale);
  beta_ = store.add_param(prefix + ".bias", Shape{c_}, ParamRole::NormShift);
  running_mean_ = store.add_buffer(prefix + ".running_mean", Shape{c_}, 0.0);
  running_var_ = store.add_buffer(prefix + ".running_var", Shape{c_}, 1.0);
  mean_.assign(c_, 0);
  invstd_.assign(c_, 0);
  return in;
}

template <class T>
const Tensor& BatchNorm<T>::forward(const Tensor& x, bool train) {
  const int64_t m = x.numel() / c_, c = c_;
  x_ = x;
  y_.resize<T>(x.shape());
  const T* xp = x.data<T>();
  T* yp = y_.data<T>();
  const T* gamma = store_->value(gamma_);
  const T* beta = store_->value(beta_);
  T* rmean = store_->buffer(running_mean_);
  T* rvar = store_->buffer(running_var_);
  if (train) {
    HPC_REQUIRE(m > 1, "batch norm needs more than one value per channel in training (batch of ", x.shape()[0],
                " sample(s)); use a larger batch size");
    std::vector<double> part1(kMaxParts * c, 0.0), part2(kMaxParts * c, 0.0);
    const int parts = parallel_rows(m, kMinRowsPerPart, kMaxParts, [&](int64_t b, int64_t e, int p) {
      blocked_sums<T>(b, e, c, &part1[p * c], &part2[p * c], [&](int64_t r, T* s1, T* s2) {
        const T* row = xp + r * c;
        for (int64_t j = 0; j < c; ++j) {
          const T d = row[j] - xp[j];  // shift by the first row
          s1[j] += d;
          s2[j] += d * d;
        }
      });
    });
    for (int64_t j = 0; j < c; ++j) {
      double s1 = 0, s2 = 0;
      for (int p = 0; p < parts; ++p) {
        s1 += part1[p * c + j];
        s2 += part2[p * c + j];
      }
      const double dm = s1 / static_cast<double>(m);
      const double var = std::max(0.0, s2 / static_cast<double>(m) - dm * dm);
      mean_[j] = static_cast<double>(xp[j]) + dm;
      invstd_[j] = 1.0 / std::sqrt(var + eps_);
      // Running variance is unbiased (as PyTorch); normalisation uses the biased one.
      rmean[j] = static_cast<T>((1 - momentum_) * rmean[j] + momentum_ * mean_[j]);
      rvar[j] = static_cast<T>((1 - momentum_) * rvar[j] + momentum_ * var * m / (m - 1));
    }
  } else {
    for (int64_t j = 0; j < c; ++j) {
      mean_[j] = rmean[j];
      invstd_[j] = 1.0 / std::sqrt(static_cast<double>(rvar[j]) + eps_);
    }
  }
  // y = x * scale + shift with per-channel scale = gamma*invstd, shift = beta - mean*scale.
  std::vector<T> scale(c), shift(c);
  for (int64_t j = 0; j < c; ++j) {
    scale[j] = static_cast<T>(gamma[j] * invstd_[j]);
    shift[j] = static_cast<T>(beta[j] - mean_[j] * gamma[j] * invstd_[j]);
  }
  const T* sc = scale.data();
  const T* sh = shift.data();
  const bool relu = relu_;
  parallel_rows(m, kMinRowsPerPart, kMaxParts, [&](int64_t b, int64_t e, int) {
    for (int64_t r = b; r < e; ++r) {
      const T* row = xp + r * c;
      T* out = yp + r * c;
      if (relu) {
        for (int64_t j = 0; j < c; ++j) out[j] = std::max(row[j] * sc[j] + sh[j], T(0));
      } else {
        for (int64_t j = 0; j < c; ++j) out[j] = row[j] * sc[j] + sh[j];
      }
    }
  });
  return y_;
}

template <class T>
const Tensor& BatchNorm<T>::backward(const Tensor& dy, bool need_dx) {
  const int64_t m = x_.numel() / c_, c = c_;
  const T* xp = x_.data<T>();
  const T* yp = y_.data<T>();
  const T* dyp = dy.data<T>();
  const T* gamma = store_->value(gamma_);
  T* dgamma = store_->grad(gamma_);
  T* dbeta = store_->grad(beta_);
  const bool relu = relu_;
  std::vector<T> mean_t(c);
  for (int64_t j = 0; j < c; ++j) mean_t[j] = static_cast<T>(mean_[j]);
  const T* mu = mean_t.data();
  // sum g and sum g * (x - mean), where g is dy masked by the fused ReLU.
  std::vector<double> part1(kMaxParts * c, 0.0), part2(kMaxParts * c, 0.0);
  const int parts = parallel_rows(m, kMinRowsPerPart, kMaxParts, [&](int64_t b, int64_t e, int p) {
    blocked_sums<T>(b, e, c, &part1[p * c], &part2[p * c], [&](int64_t r, T* s1, T* s2) {
      const T* row = xp + r * c;
      const T* g = dyp + r * c;
      const T* out = yp + r * c;
      for (int64_t j = 0; j < c; ++j) {
        const T gj = relu && out[j] <= T(0) ? T(0) : g[j];
        s1[j] += gj;
        s2[j] += gj * (row[j] - mu[j]);
      }
    });
  });
  std::vector<double> sdy(c, 0.0), sdyx(c, 0.0);
  for (int64_t j = 0; j < c; ++j)
    for (int p = 0; p < parts; ++p) {
      sdy[j] += part1[p * c + j];
      sdyx[j] += part2[p * c + j];
    }
  for (int64_t j = 0; j < c; ++j) {
    dgamma[j] = static_cast<T>(sdyx[j] * invstd_[j]);
    dbeta[j] = static_cast<T>(sdy[j]);
  }
  if (!need_dx) return dx_;
  // dx = gamma*invstd * (g - mean(g) - xhat * mean(g*xhat)), written as g*a + x*b + k.
  std::vector<T> a(c), bcoef(c), k(c);
  for (int64_t j = 0; j < c; ++j) {
    const double gi = gamma[j] * invstd_[j];
    const double mdy = sdy[j] / m, mdyxhat = sdyx[j] * invstd_[j] / m;
    a[j] = static_cast<T>(gi);
    bcoef[j] = static_cast<T>(-gi * mdyxhat * invstd_[j]);
    k[j] = static_cast<T>(-gi * mdy + gi * mdyxhat * invstd_[j] * mean_[j]);
  }
  dx_.resize<T>(x_.shape());
  T* dxp = dx_.data<T>();
  const T *pa = a.data(), *pb = bcoef.data(), *pk = k.data();
  parallel_rows(m, kMinRowsPerPart, kMaxParts, [&](int64_t b, int64_t e, int) {
    for (int64_t r = b; r < e; ++r) {
      const T* row = xp + r * c;
      const T* g = dyp + r * c;
      const T* out = yp + r * c;
      T* d = dxp + r * c;
      for (int64_t j = 0; j < c; ++j) {
        const T gj = relu && out[j] <= T(0) ? T(0) : g[j];
        d[j] = gj * pa[j] + row[j] * pb[j] + pk[j];
      }
    }
  });
  return dx_;
}

template class BatchNorm<float>;
template class BatchNorm<double>;

}  // namespace hpc::nn

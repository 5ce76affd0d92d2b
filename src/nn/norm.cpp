// Batch normalisation over the channel (last) dimension: NHWC activations are an M x C
// matrix with M = N*H*W, and N x F features are the same with M = N. Statistics are
// accumulated in double whatever T is, so float training does not lose the mean of 12k rows.
#include <cmath>

#include "nn/layer.hpp"

namespace hpc::nn {

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
    std::vector<double> sum(c, 0.0), sq(c, 0.0);
    for (int64_t r = 0; r < m; ++r) {
      const T* row = xp + r * c;
      for (int64_t j = 0; j < c; ++j) sum[j] += row[j];
    }
    for (int64_t j = 0; j < c; ++j) mean_[j] = sum[j] / static_cast<double>(m);
    for (int64_t r = 0; r < m; ++r) {  // two passes: no cancellation in E[x^2] - E[x]^2
      const T* row = xp + r * c;
      for (int64_t j = 0; j < c; ++j) {
        const double d = row[j] - mean_[j];
        sq[j] += d * d;
      }
    }
    for (int64_t j = 0; j < c; ++j) {
      const double var = sq[j] / static_cast<double>(m);
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
  for (int64_t r = 0; r < m; ++r) {
    const T* row = xp + r * c;
    T* out = yp + r * c;
    for (int64_t j = 0; j < c; ++j) out[j] = row[j] * scale[j] + shift[j];
  }
  return y_;
}

template <class T>
const Tensor& BatchNorm<T>::backward(const Tensor& dy, bool need_dx) {
  const int64_t m = x_.numel() / c_, c = c_;
  const T* xp = x_.data<T>();
  const T* dyp = dy.data<T>();
  const T* gamma = store_->value(gamma_);
  T* dgamma = store_->grad(gamma_);
  T* dbeta = store_->grad(beta_);
  std::vector<double> sdy(c, 0.0), sdyx(c, 0.0);  // sum dy, sum dy * (x - mean)
  for (int64_t r = 0; r < m; ++r) {
    const T* row = xp + r * c;
    const T* g = dyp + r * c;
    for (int64_t j = 0; j < c; ++j) {
      sdy[j] += g[j];
      sdyx[j] += g[j] * (row[j] - mean_[j]);
    }
  }
  for (int64_t j = 0; j < c; ++j) {
    dgamma[j] = static_cast<T>(sdyx[j] * invstd_[j]);
    dbeta[j] = static_cast<T>(sdy[j]);
  }
  if (!need_dx) return dx_;
  // dx = gamma*invstd * (dy - mean(dy) - xhat * mean(dy*xhat)), written as dy*a + x*b + k.
  std::vector<T> a(c), b(c), k(c);
  for (int64_t j = 0; j < c; ++j) {
    const double gi = gamma[j] * invstd_[j];
    const double mdy = sdy[j] / m, mdyxhat = sdyx[j] * invstd_[j] / m;
    a[j] = static_cast<T>(gi);
    b[j] = static_cast<T>(-gi * mdyxhat * invstd_[j]);
    k[j] = static_cast<T>(-gi * mdy + gi * mdyxhat * invstd_[j] * mean_[j]);
  }
  dx_.resize<T>(x_.shape());
  T* dxp = dx_.data<T>();
  for (int64_t r = 0; r < m; ++r) {
    const T* row = xp + r * c;
    const T* g = dyp + r * c;
    T* out = dxp + r * c;
    for (int64_t j = 0; j < c; ++j) out[j] = g[j] * a[j] + row[j] * b[j] + k[j];
  }
  return dx_;
}

template class BatchNorm<float>;
template class BatchNorm<double>;

}  // namespace hpc::nn

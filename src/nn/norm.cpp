// Batch normalisation over the channel (last) dimension: NHWC activations are an M x C
// matrix with M = N*H*W, and N x F features are the same with M = N. An optional ReLU and
// an optional max pool are fused in: the activations of these small models do not fit in
// L2, so every pass over them that fusion removes is time saved (the cnn's first block
// spends more time in these passes than in its convolution).
//
// Statistics: blocks of kBlock rows are summed in T (vectorised), blocks and threads are
// combined in double. Values are taken relative to the first row (a shift), so the one-pass
// variance E[(x-K)^2] - E[x-K]^2 does not cancel catastrophically.
//
// Exactness of the fusions: the ReLU decision is recomputed from x with the same function
// forward used (affine below), and the fused pool's backward visits rows in the order the
// unfused batch norm does, so fused and unfused layers give identical bits.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "nn/layer.hpp"
#include "nn/parallel.hpp"
#include "nn/pool_row.hpp"

namespace hpc::nn {
namespace {
constexpr int64_t kBlock = 64;
constexpr int kMaxParts = 64;
constexpr int64_t kMinRowsPerPart = 512;

// Sums over rows [b, e) in blocks of kBlock rows: rows(r0, r1, s1, s2) adds rows [r0, r1)
// into the block accumulators s1, s2 (c entries each, restrict-qualified so the compiler
// vectorises across channels); each block is then added to out1/out2 in double.
template <class T, class F>
void blocked_sums(int64_t b, int64_t e, int64_t c, double* out1, double* out2, F&& rows) {
  std::vector<T> acc(2 * c);
  T* s1 = acc.data();
  T* s2 = acc.data() + c;
  for (int64_t r0 = b; r0 < e; r0 += kBlock) {
    std::fill(acc.begin(), acc.end(), T(0));
    const int64_t r1 = std::min(e, r0 + kBlock);
    rows(r0, r1, s1, s2);
    for (int64_t j = 0; j < c; ++j) {
      out1[j] += s1[j];
      out2[j] += s2[j];
    }
  }
}

// What batch norm outputs (and a fused pool compares), with or without the fused ReLU.
template <bool Relu>
constexpr Seen kOutput = Relu ? Seen::NormalisedRelu : Seen::Normalised;

// The incoming gradient g masked by the fused ReLU. Every operand is loaded
// unconditionally, so the loops stay branch-free and vectorise.
template <bool Relu, class T>
inline T relu_masked(T g, T x, T scale, T shift) {
  if constexpr (Relu) return affine(x, scale, shift) > T(0) ? g : T(0);
  return g;
}

// dx = g*a + x*b + k (see backward); one function, so every caller rounds alike.
template <class T>
inline T input_gradient(T g, T x, T a, T b, T k) {
  return g * a + x * b + k;
}

// Calls f(std::bool_constant<relu>{}) so kernels are compiled once per case.
template <class F>
void with_relu(bool relu, F&& f) {
  if (relu) f(std::true_type{});
  else f(std::false_type{});
}

// Where each input row (one cell of one sample) sits in a grid of non-overlapping pooling
// windows. Walks rows in order with counters rather than dividing per row.
struct PoolWalk {
  int64_t h, w, k, s, ho, wo;
  // Calls fn(r, window, pos) for r in [b, e): window is the pooled row (sample*ho*wo +
  // oh*wo + ow) whose window holds r, pos is r's place in it (kh*k + kw); window is -1 for
  // cells no window covers (floor mode's remainder, gaps when k < s).
  template <class F>
  void rows(int64_t b, int64_t e, F&& fn) const {
    const int64_t hw = h * w;
    int64_t n = b / hw, hh = (b % hw) / w, ww = b % w;
    int64_t oh = hh / s, kh = hh % s, ow = ww / s, kw = ww % s;
    for (int64_t r = b; r < e; ++r) {
      const bool covered = kh < k && kw < k && oh < ho && ow < wo;
      fn(r, covered ? (n * ho + oh) * wo + ow : int64_t{-1}, kh * k + kw);
      if (++kw == s) kw = 0, ++ow;
      if (++ww == w) {
        ww = 0, ow = 0, kw = 0;
        if (++kh == s) kh = 0, ++oh;
        if (++hh == h) hh = 0, oh = 0, kh = 0, ++n;
      }
    }
  }
};

// Backward's row kernels. g is the gradient reaching the normalised output: dy's row, or
// with a fused pool (Pooled) the window's pooled gradient where this cell won it (idx ==
// at) and zero where it lost; then masked by the fused ReLU. Functions of their own with
// restrict-qualified arguments, so the compiler vectorises across channels.
template <bool Relu, bool Pooled, class T>
inline T row_gradient(const T* __restrict g, const uint8_t* __restrict idx, uint8_t at, int64_t j, T x, T sc,
                      T sh) {
  T gj = g[j];
  if constexpr (Pooled) gj = idx[j] == at ? gj : T(0);
  return relu_masked<Relu>(gj, x, sc, sh);
}

// Adds one row's g and g * (x - mean) into s1 and s2.
template <bool Relu, bool Pooled, class T>
void sum_row(int64_t c, const T* __restrict x, const T* __restrict g, const uint8_t* __restrict idx, uint8_t at,
             const T* __restrict sc, const T* __restrict sh, const T* __restrict mu, T* __restrict s1,
             T* __restrict s2) {
  for (int64_t j = 0; j < c; ++j) {
    const T gj = row_gradient<Relu, Pooled>(g, idx, at, j, x[j], sc[j], sh[j]);
    s1[j] += gj;
    s2[j] += gj * (x[j] - mu[j]);
  }
}

template <class T>
struct RowCoefficients {
  const T *scale, *shift, *a, *b, *k;  // forward's normalisation; dx = g*a + x*b + k
};

// One row of dx; g == nullptr: a cell no pooling window covers (its g is zero).
template <bool Relu, bool Pooled, class T>
void dx_row(int64_t c, const T* __restrict x, const T* __restrict g, const uint8_t* __restrict idx, uint8_t at,
            const RowCoefficients<T> co, T* __restrict d) {
  const T* __restrict sc = co.scale;
  const T* __restrict sh = co.shift;
  const T* __restrict a = co.a;
  const T* __restrict b = co.b;
  const T* __restrict k = co.k;
  if (!g) {
    for (int64_t j = 0; j < c; ++j) d[j] = input_gradient(T(0), x[j], a[j], b[j], k[j]);
    return;
  }
  for (int64_t j = 0; j < c; ++j)
    d[j] = input_gradient(row_gradient<Relu, Pooled>(g, idx, at, j, x[j], sc[j], sh[j]), x[j], a[j], b[j], k[j]);
}

}  // namespace

template <class T>
std::string BatchNorm<T>::kind() const {
  return std::string(relu_ ? "batchnorm_relu" : "batchnorm") + (pooled() ? "_maxpool" : "");
}

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
  if (!pooled()) return in;
  HPC_CHECK(in.rank() == 3, "a max pool fused into batch norm expects H x W x C input, got ", in.str());
  HPC_CHECK(pool_.kernel >= 1 && pool_.kernel <= 15 && pool_.kernel <= pool_.stride,
            "a max pool fused into batch norm needs non-overlapping windows of at most 15 (kernel <= stride), got "
            "kernel ",
            pool_.kernel, " stride ", pool_.stride);
  h_ = in[0];
  w_ = in[1];
  ho_ = (h_ - pool_.kernel) / pool_.stride + 1;
  wo_ = (w_ - pool_.kernel) / pool_.stride + 1;
  HPC_CHECK(h_ >= pool_.kernel && w_ >= pool_.kernel, "maxpool2d output would be empty for input ", in.str());
  return Shape{ho_, wo_, c_};
}

template <class T>
void BatchNorm<T>::shifted_sums(const T* xp, int64_t m, const T* shift, std::vector<double>& s1,
                                std::vector<double>& s2) {
  const int64_t c = c_;
  row_sums(m, s1, s2, [&](int64_t r0, int64_t r1, T* __restrict a1, T* __restrict a2) {
    const T* __restrict k = shift;
    for (int64_t r = r0; r < r1; ++r) {
      const T* __restrict row = xp + r * c;
      for (int64_t j = 0; j < c; ++j) {
        const T d = row[j] - k[j];
        a1[j] += d;
        a2[j] += d * d;
      }
    }
  });
}

template <class T>
void BatchNorm<T>::statistics(const T* xp, int64_t m, bool train) {
  const int64_t c = c_;
  const T* gamma = store_->value(gamma_);
  const T* beta = store_->value(beta_);
  T* rmean = store_->buffer(running_mean_);
  T* rvar = store_->buffer(running_var_);
  if (train) {
    // Values are taken relative to a shift K per channel: this rank's first row, or with
    // synchronised statistics the global mean (found first: every rank needs the same K).
    std::vector<double> s1, s2;
    std::vector<T> shift(xp, xp + c);
    shifted_sums(xp, m, shift.data(), s1, s2);
    count_ = static_cast<double>(m);
    if (sync_) {
      std::vector<double> total(c + 2);
      for (int64_t j = 0; j < c; ++j) total[j] = s1[j] + count_ * static_cast<double>(shift[j]);
      total[c] = count_;
      total[c + 1] = 1;  // the number of ranks
      sync_(total.data(), c + 2);
      count_ = total[c];
      rows_weight_ = total[c + 1] * static_cast<double>(m) / count_;
      for (int64_t j = 0; j < c; ++j) shift[j] = static_cast<T>(total[j] / count_);
      shifted_sums(xp, m, shift.data(), s1, s2);
      std::vector<double> both(s1);
      both.insert(both.end(), s2.begin(), s2.end());
      sync_(both.data(), 2 * c);
      std::copy(both.begin(), both.begin() + c, s1.begin());
      std::copy(both.begin() + c, both.end(), s2.begin());
    }
    const double n = count_;
    for (int64_t j = 0; j < c; ++j) {
      const double dm = s1[j] / n;
      const double var = std::max(0.0, s2[j] / n - dm * dm);
      mean_[j] = static_cast<double>(shift[j]) + dm;
      invstd_[j] = 1.0 / std::sqrt(var + eps_);
      // Running variance is unbiased (as PyTorch); normalisation uses the biased one.
      rmean[j] = static_cast<T>((1 - momentum_) * rmean[j] + momentum_ * mean_[j]);
      rvar[j] = static_cast<T>((1 - momentum_) * rvar[j] + momentum_ * var * n / (n - 1));
    }
  } else {
    for (int64_t j = 0; j < c; ++j) {
      mean_[j] = rmean[j];
      invstd_[j] = 1.0 / std::sqrt(static_cast<double>(rvar[j]) + eps_);
    }
  }
  // y = x * scale + shift with per-channel scale = gamma*invstd, shift = beta - mean*scale.
  scale_.resize(c);
  shift_.resize(c);
  for (int64_t j = 0; j < c; ++j) {
    scale_[j] = static_cast<T>(gamma[j] * invstd_[j]);
    shift_[j] = static_cast<T>(beta[j] - mean_[j] * gamma[j] * invstd_[j]);
  }
}

template <class T>
const Tensor& BatchNorm<T>::forward(const Tensor& x, bool train) {
  const int64_t m = x.numel() / c_, c = c_;
  HPC_REQUIRE(!train || m > 1, "batch norm needs more than one value per channel in training (batch of ",
              x.shape()[0], " sample(s)); use a larger batch size");
  x_ = x;
  const T* xp = x.data<T>();
  statistics(xp, m, train);
  if (pooled()) {
    pool_forward(xp, x.shape()[0]);
    return y_;
  }
  y_.resize<T>(x.shape());
  T* yp = y_.data<T>();
  const T* __restrict sc = scale_.data();
  const T* __restrict sh = shift_.data();
  with_relu(relu_, [&](auto relu_c) {
    constexpr bool kRelu = decltype(relu_c)::value;
    parallel_rows(m, kMinRowsPerPart, kMaxParts, [&](int64_t b, int64_t e, int) {
      for (int64_t r = b; r < e; ++r) {
        const T* __restrict row = xp + r * c;
        T* __restrict out = yp + r * c;
        for (int64_t j = 0; j < c; ++j) out[j] = seen<kOutput<kRelu>>(row[j], sc[j], sh[j]);
      }
    });
  });
  return y_;
}

// The pooled output and, per output value, the winner's place in its window (the first
// maximum wins, as MaxPool2d and PyTorch).
template <class T>
void BatchNorm<T>::pool_forward(const T* xp, int64_t n) {
  const int64_t c = c_, s = pool_.stride, w = w_;
  y_.resize<T>(Shape{n, ho_, wo_, c});
  argmax_.resize<uint8_t>(Shape{n, ho_, wo_, c});
  T* yp = y_.data<T>();
  uint8_t* am = argmax_.data<uint8_t>();
  const T* __restrict sc = scale_.data();
  const T* __restrict sh = shift_.data();
  const PoolWindows win{c, pool_.kernel, pool_.stride, w_, wo_};
  with_relu(relu_, [&](auto relu_c) {
    constexpr bool kRelu = decltype(relu_c)::value;
    parallel_rows(n * ho_, 8, kMaxParts, [&](int64_t b, int64_t e, int) {
      for (int64_t q = b; q < e; ++q)  // q = sample * ho + oh: one row of windows
        pool_row<kOutput<kRelu>>(win, xp + (q / ho_ * h_ + q % ho_ * s) * w * c, sc, sh, yp + q * wo_ * c,
                        am + q * wo_ * c);
    });
  });
}

template <class T>
template <class RowSums>
void BatchNorm<T>::row_sums(int64_t m, std::vector<double>& out1, std::vector<double>& out2, RowSums&& rows) {
  const int64_t c = c_;
  std::vector<double> part1(kMaxParts * c, 0.0), part2(kMaxParts * c, 0.0);
  const int parts = fixed_parts(m, kMinRowsPerPart, kMaxParts, [&, c](int64_t b, int64_t e, int p) {
    blocked_sums<T>(b, e, c, &part1[p * c], &part2[p * c], rows);
  });
  out1.assign(c, 0.0);
  out2.assign(c, 0.0);
  for (int64_t j = 0; j < c; ++j)
    for (int p = 0; p < parts; ++p) {
      out1[j] += part1[p * c + j];
      out2[j] += part2[p * c + j];
    }
}

template <class T>
const Tensor& BatchNorm<T>::backward(const Tensor& dy, bool need_dx) {
  const int64_t c = c_;
  // sum g and sum g * (x - mean), where g is the gradient reaching the normalised output
  // (see sum_row).
  std::vector<double> sdy, sdyx;
  gradient_sums(dy.data<T>(), sdy, sdyx);
  // Parameter gradients from this rank's samples (the gradient all-reduce combines ranks).
  T* dgamma = store_->grad(gamma_);
  T* dbeta = store_->grad(beta_);
  for (int64_t j = 0; j < c; ++j) {
    dgamma[j] = static_cast<T>(sdyx[j] * invstd_[j]);
    dbeta[j] = static_cast<T>(sdy[j]);
  }
  if (!need_dx) return dx_;
  if (sync_) {  // every rank's samples moved the statistics: dx needs the global sums
    // Each rank's dy is the gradient of the mean loss over its own rows, and the all-reduce of
    // the gradients weighs each rank by its share of the global batch (dist/bucketer.hpp). So the
    // sums are added at a common scale, each rank's weighed by its rows, and brought back to this
    // rank's scale after; where the shards are even the weight is exactly 1 and changes no bit.
    // Unweighed, dx was 5% off on shards of 3 and 5 rows, and 50 steps of 64 samples on 3 ranks
    // (21, 21 and 22) ended 1.4e-3 off one rank's test loss.
    std::vector<double> both(sdy);
    both.insert(both.end(), sdyx.begin(), sdyx.end());
    for (double& v : both) v *= rows_weight_;
    sync_(both.data(), 2 * c);
    for (double& v : both) v /= rows_weight_;
    std::copy(both.begin(), both.begin() + c, sdy.begin());
    std::copy(both.begin() + c, both.end(), sdyx.begin());
  }
  input_gradient(dy.data<T>(), sdy, sdyx);
  return dx_;
}

template <class T>
void BatchNorm<T>::gradient_sums(const T* dyp, std::vector<double>& sdy, std::vector<double>& sdyx) {
  const int64_t m = x_.numel() / c_, c = c_;
  const T* xp = x_.data<T>();
  const uint8_t* am = pooled() ? argmax_.data<uint8_t>() : nullptr;
  const T* __restrict sc = scale_.data();
  const T* __restrict sh = shift_.data();
  std::vector<T> mean_t(c);
  for (int64_t j = 0; j < c; ++j) mean_t[j] = static_cast<T>(mean_[j]);
  const T* __restrict mu = mean_t.data();
  const PoolWalk walk{h_, w_, pool_.kernel, pool_.stride, ho_, wo_};
  with_relu(relu_, [&](auto relu_c) {
    constexpr bool kRelu = decltype(relu_c)::value;
    row_sums(m, sdy, sdyx, [&](int64_t r0, int64_t r1, T* s1, T* s2) {
      if (!pooled()) {
        for (int64_t r = r0; r < r1; ++r)
          sum_row<kRelu, false>(c, xp + r * c, dyp + r * c, nullptr, 0, sc, sh, mu, s1, s2);
        return;
      }
      walk.rows(r0, r1, [&](int64_t r, int64_t window, int64_t pos) {
        if (window >= 0)  // a cell no window covers has no gradient
          sum_row<kRelu, true>(c, xp + r * c, dyp + window * c, am + window * c, static_cast<uint8_t>(pos), sc, sh,
                               mu, s1, s2);
      });
    });
  });
}

template <class T>
void BatchNorm<T>::input_gradient(const T* dyp, const std::vector<double>& sdy, const std::vector<double>& sdyx) {
  const int64_t m = x_.numel() / c_, c = c_;
  const T* xp = x_.data<T>();
  const uint8_t* am = pooled() ? argmax_.data<uint8_t>() : nullptr;
  const T* gamma = store_->value(gamma_);
  // dx = gamma*invstd * (g - mean(g) - xhat * mean(g*xhat)), written as g*a + x*b + k.
  std::vector<T> a(c), bcoef(c), k(c);
  for (int64_t j = 0; j < c; ++j) {
    const double gi = gamma[j] * invstd_[j];
    const double mdy = sdy[j] / count_, mdyxhat = sdyx[j] * invstd_[j] / count_;
    a[j] = static_cast<T>(gi);
    bcoef[j] = static_cast<T>(-gi * mdyxhat * invstd_[j]);
    k[j] = static_cast<T>(-gi * mdy + gi * mdyxhat * invstd_[j] * mean_[j]);
  }
  dx_.resize<T>(x_.shape());
  T* dxp = dx_.data<T>();
  const T *__restrict pa = a.data(), *__restrict pb = bcoef.data(), *__restrict pk = k.data();
  const RowCoefficients<T> co{scale_.data(), shift_.data(), pa, pb, pk};
  const PoolWalk walk{h_, w_, pool_.kernel, pool_.stride, ho_, wo_};
  with_relu(relu_, [&](auto relu_c) {
    constexpr bool kRelu = decltype(relu_c)::value;
    parallel_rows(m, kMinRowsPerPart, kMaxParts, [&](int64_t b, int64_t e, int) {
      if (!pooled()) {
        for (int64_t r = b; r < e; ++r) dx_row<kRelu, false>(c, xp + r * c, dyp + r * c, nullptr, 0, co, dxp + r * c);
        return;
      }
      walk.rows(b, e, [&](int64_t r, int64_t window, int64_t pos) {
        if (window < 0) dx_row<kRelu, false, T>(c, xp + r * c, nullptr, nullptr, 0, co, dxp + r * c);
        else dx_row<kRelu, true>(c, xp + r * c, dyp + window * c, am + window * c, static_cast<uint8_t>(pos), co,
                                 dxp + r * c);
      });
    });
  });
}

template class BatchNorm<float>;
template class BatchNorm<double>;

}  // namespace hpc::nn

// Sequential chains and the residual block.
#include <algorithm>
#include <cmath>

#include "nn/layer.hpp"

namespace hpc::nn {

template <class T>
Shape Sequential<T>::setup(const Shape& in, ParamStore<T>& store, const std::string& prefix) {
  Shape s = in;
  first_slots_.clear();
  shapes_.assign(1, in);
  for (size_t i = 0; i < layers_.size(); ++i) {
    first_slots_.push_back(store.slots().size());
    s = layers_[i]->setup(s, store, prefix.empty() ? std::to_string(i) : prefix + "." + std::to_string(i));
    shapes_.push_back(s);
  }
  first_slots_.push_back(store.slots().size());
  return s;
}

template <class T>
const Tensor& Sequential<T>::forward(const Tensor& x, bool train) {
  const Tensor* cur = &x;
  for (auto& l : layers_) cur = &l->forward(*cur, train);
  return *cur;
}

template <class T>
const Tensor& Sequential<T>::backward(const Tensor& dy, bool need_dx) {
  return backward_with(dy, need_dx, [](size_t) {});
}

template <class T>
double Sequential<T>::forward_flops() const {
  double f = 0;
  for (const auto& l : layers_) f += l->forward_flops();
  return f;
}

template <class T>
double Sequential<T>::backward_flops(bool need_dx) const {
  double f = 0;
  for (size_t i = 0; i < layers_.size(); ++i) f += layers_[i]->backward_flops(need_dx || i > 0);
  return f;
}

template <class T>
Shape Residual<T>::setup(const Shape& in, ParamStore<T>& store, const std::string& prefix) {
  Shape out = main_.setup(in, store, prefix + ".main");
  Shape short_out = shortcut_.empty() ? in : shortcut_.setup(in, store, prefix + ".shortcut");
  HPC_CHECK(out == short_out, "residual branches disagree: ", out.str(), " vs ", short_out.str());
  return out;
}

template <class T>
const Tensor& Residual<T>::forward(const Tensor& x, bool train) {
  const Tensor& a = main_.forward(x, train);
  const Tensor& b = shortcut_.empty() ? x : shortcut_.forward(x, train);
  y_.resize<T>(a.shape());
  const T* ap = a.data<T>();
  const T* bp = b.data<T>();
  T* yp = y_.data<T>();
  const int64_t n = a.numel();
  for (int64_t i = 0; i < n; ++i) {
    const T s = ap[i] + bp[i];
    yp[i] = s > T(0) ? s : T(0);
  }
  return y_;
}

template <class T>
const Tensor& Residual<T>::backward(const Tensor& dy, bool need_dx) {
  dsum_.resize<T>(dy.shape());
  const T* g = dy.data<T>();
  const T* yp = y_.data<T>();
  T* ds = dsum_.data<T>();
  const int64_t n = dy.numel();
  for (int64_t i = 0; i < n; ++i) ds[i] = yp[i] > T(0) ? g[i] : T(0);
  // The add sends the same gradient into both branches; their input gradients sum.
  const Tensor& dmain = main_.backward(dsum_, need_dx);
  if (!need_dx) {
    if (!shortcut_.empty()) shortcut_.backward(dsum_, false);
    return dx_;
  }
  const Tensor& dshort = shortcut_.empty() ? dsum_ : shortcut_.backward(dsum_, true);
  dx_.resize<T>(dmain.shape());
  const T* a = dmain.data<T>();
  const T* b = dshort.data<T>();
  T* d = dx_.data<T>();
  const int64_t m = dmain.numel();
  for (int64_t i = 0; i < m; ++i) d[i] = a[i] + b[i];
  return dx_;
}

template <class T>
double SoftmaxCrossEntropy<T>::forward(const Tensor& logits, const int32_t* labels) {
  const int64_t n = logits.shape()[0], k = logits.shape()[1];
  labels_ = labels;
  prob_.resize<T>(logits.shape());
  const T* z = logits.data<T>();
  T* p = prob_.data<T>();
  double loss = 0;
  for (int64_t r = 0; r < n; ++r) {
    const T* zr = z + r * k;
    T* pr = p + r * k;
    T mx = zr[0];
    for (int64_t j = 1; j < k; ++j) mx = std::max(mx, zr[j]);
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) {
      pr[j] = static_cast<T>(std::exp(static_cast<double>(zr[j] - mx)));
      sum += pr[j];
    }
    const double log_sum = std::log(sum) + mx;
    for (int64_t j = 0; j < k; ++j) pr[j] = static_cast<T>(pr[j] / sum);
    const int32_t y = labels[r];
    HPC_CHECK(y >= 0 && y < k, "label ", y, " outside [0, ", k, ")");
    // -sum_j target_j * log p_j, with target = (1-s) onehot + s/k
    double row = (1 - smoothing_) * (log_sum - zr[y]);
    if (smoothing_ > 0) {
      double mean_logp = 0;
      for (int64_t j = 0; j < k; ++j) mean_logp += zr[j] - log_sum;
      row -= smoothing_ * mean_logp / k;
    }
    loss += row;
  }
  return loss / n;
}

template <class T>
const Tensor& SoftmaxCrossEntropy<T>::backward() {
  const int64_t n = prob_.shape()[0], k = prob_.shape()[1];
  dlogits_.resize<T>(prob_.shape());
  const T* p = prob_.data<T>();
  T* d = dlogits_.data<T>();
  const double off = smoothing_ / k, on = 1 - smoothing_ + off, inv_n = 1.0 / n;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < k; ++j)
      d[r * k + j] = static_cast<T>((p[r * k + j] - (j == labels_[r] ? on : off)) * inv_n);
  return dlogits_;
}

template class Sequential<float>;
template class Sequential<double>;
template class Residual<float>;
template class Residual<double>;
template class SoftmaxCrossEntropy<float>;
template class SoftmaxCrossEntropy<double>;

}  // namespace hpc::nn

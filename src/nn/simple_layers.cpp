// The cheap layers: ReLU, max pool, global average pool, flatten and linear.
#include <algorithm>
#include <cstring>
#include <limits>

#include "nn/gemm.hpp"
#include "nn/layer.hpp"
#include "nn/pool_row.hpp"

namespace hpc::nn {

// ---- ReLU ---------------------------------------------------------------------------------
template <class T>
const Tensor& ReLU<T>::forward(const Tensor& x, bool /*train*/) {
  y_.resize<T>(x.shape());
  const T* xp = x.data<T>();
  T* yp = y_.data<T>();
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) yp[i] = xp[i] > T(0) ? xp[i] : T(0);
  return y_;
}

template <class T>
const Tensor& ReLU<T>::backward(const Tensor& dy, bool need_dx) {
  if (!need_dx) return dx_;
  dx_.resize<T>(dy.shape());
  const T* yp = y_.data<T>();
  const T* g = dy.data<T>();
  T* dxp = dx_.data<T>();
  const int64_t n = dy.numel();
  for (int64_t i = 0; i < n; ++i) dxp[i] = yp[i] > T(0) ? g[i] : T(0);
  return dx_;
}

// ---- Max pool (windows that do not fit are dropped, as PyTorch's floor mode) ----------------
template <class T>
Shape MaxPool2d<T>::setup(const Shape& in, ParamStore<T>&, const std::string&) {
  HPC_CHECK(in.rank() == 3, "maxpool2d expects H x W x C input, got ", in.str());
  HPC_CHECK(kernel_ >= 1 && kernel_ <= 15 && stride_ >= 1, "maxpool2d kernel must be 1..15 and stride >= 1, got ",
            kernel_, " and ", stride_);
  // PyTorch's bound: every window then holds at least one cell of the image.
  HPC_CHECK(pad_ >= 0 && 2 * pad_ <= kernel_, "maxpool2d padding must be 0..kernel/2, got ", pad_);
  h_ = in[0];
  w_ = in[1];
  c_ = in[2];
  ho_ = (h_ + 2 * pad_ - kernel_) / stride_ + 1;
  wo_ = (w_ + 2 * pad_ - kernel_) / stride_ + 1;
  HPC_CHECK(ho_ > 0 && wo_ > 0, "maxpool2d output would be empty for input ", in.str());
  return Shape{ho_, wo_, c_};
}

// The argmax is kept as the winner's position inside its window (one byte; kernel <= 15).
// Windows that do not overlap (kernel <= stride, the usual 2x2/2) let backward write every
// input gradient once, densely, instead of clearing the whole buffer and then scattering.
template <class T>
const Tensor& MaxPool2d<T>::forward(const Tensor& x, bool /*train*/) {
  const int64_t n = x.shape()[0], c = c_;
  y_.resize<T>(Shape{n, ho_, wo_, c});
  argmax_.resize<uint8_t>(Shape{n, ho_, wo_, c});
  const T* xp = x.data<T>();
  T* yp = y_.data<T>();
  uint8_t* am = argmax_.data<uint8_t>();
  dx_.resize<T>(x.shape());
  if (pad_ > 0) {
    padded_forward(xp, yp, am, n);
    return y_;
  }
  const PoolWindows win{c, kernel_, stride_, w_, wo_};
  for (int64_t q = 0; q < n * ho_; ++q)  // q = sample * ho + oh: one row of windows
    pool_row<Seen::Input, T>(win, xp + (q / ho_ * h_ + q % ho_ * stride_) * w_ * c, nullptr, nullptr,
                             yp + q * wo_ * c, am + q * wo_ * c);
  return y_;
}

namespace {
struct PaddedPool {
  int64_t h, w, c, k, s, pad, ho, wo;  // input size and channels, window, stride, padding, output size
};

// Calls cell(o, i, pos, first) for every cell inside the image of every window of n images, in
// row-major window order: o the window's output offset, i the cell's input offset (channel 0 of
// each), pos its place kh * k + kw in the whole k x k window, first whether it is the window's
// first cell inside the image. Window (oh, ow) has its corner `pad` cells up and left of the
// unpadded one's.
template <class F>
void each_padded_cell(const PaddedPool& p, int64_t n, F&& cell) {
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t oh = 0; oh < p.ho; ++oh) {
      for (int64_t ow = 0; ow < p.wo; ++ow) {
        const int64_t r0 = oh * p.s - p.pad, c0 = ow * p.s - p.pad;
        const int64_t kh0 = std::max<int64_t>(0, -r0), kh1 = std::min(p.k, p.h - r0);
        const int64_t kw0 = std::max<int64_t>(0, -c0), kw1 = std::min(p.k, p.w - c0);
        const int64_t o = ((b * p.ho + oh) * p.wo + ow) * p.c;
        for (int64_t kh = kh0; kh < kh1; ++kh)
          for (int64_t kw = kw0; kw < kw1; ++kw)
            cell(o, ((b * p.h + r0 + kh) * p.w + c0 + kw) * p.c, static_cast<uint8_t>(kh * p.k + kw),
                 kh == kh0 && kw == kw0);
      }
    }
  }
}
}  // namespace

// Padding cells are never compared: the window's first cell inside the image starts as the
// maximum and a later one replaces it only when strictly greater (row-major), as PyTorch's
// max_pool2d; the winner is recorded by its place in the whole k x k window.
template <class T>
void MaxPool2d<T>::padded_forward(const T* xp, T* yp, uint8_t* am, int64_t n) const {
  const int64_t c = c_;
  each_padded_cell(PaddedPool{h_, w_, c, kernel_, stride_, pad_, ho_, wo_}, n,
                   [&](int64_t o, int64_t i, uint8_t pos, bool first) {
                     T* __restrict out = yp + o;
                     uint8_t* __restrict idx = am + o;
                     const T* __restrict in = xp + i;
                     for (int64_t j = 0; j < c; ++j) {
                       const bool more = first || in[j] > out[j];
                       out[j] = more ? in[j] : out[j];
                       idx[j] = more ? pos : idx[j];
                     }
                   });
}

// Each window's dy to its winner, added in row-major window order where windows overlap.
template <class T>
void MaxPool2d<T>::padded_backward(const T* g, const uint8_t* am, T* dxp, int64_t n) const {
  const int64_t c = c_;
  each_padded_cell(PaddedPool{h_, w_, c, kernel_, stride_, pad_, ho_, wo_}, n,
                   [&](int64_t o, int64_t i, uint8_t pos, bool) {
                     T* __restrict d = dxp + i;
                     for (int64_t j = 0; j < c; ++j) d[j] += am[o + j] == pos ? g[o + j] : T(0);
                   });
}

template <class T>
const Tensor& MaxPool2d<T>::backward(const Tensor& dy, bool need_dx) {
  if (!need_dx) return dx_;
  const int64_t n = dy.shape()[0], c = c_, k = kernel_, s = stride_, w = w_;
  T* __restrict dxp = dx_.data<T>();
  const T* __restrict g = dy.data<T>();
  const uint8_t* __restrict am = argmax_.data<uint8_t>();
  if (pad_ > 0) {
    dx_.fill_zero();
    padded_backward(g, am, dxp, n);
    return dx_;
  }
  const bool dense = k <= s;
  if (dense) {
    // Rows and columns no window covers (floor mode's remainder, or gaps when kernel < stride)
    // get zeros; the windows' cells are written below.
    if (k < s || ho_ * s != h_ || wo_ * s != w_) dx_.fill_zero();
  } else {
    dx_.fill_zero();
  }
  for (int64_t b = 0; b < n; ++b) {
    T* dxb = dxp + b * h_ * w * c;
    for (int64_t oh = 0; oh < ho_; ++oh) {
      for (int64_t ow = 0; ow < wo_; ++ow) {
        const int64_t o = ((b * ho_ + oh) * wo_ + ow) * c;
        const T* __restrict go = g + o;
        const uint8_t* __restrict idx = am + o;
        T* corner = dxb + (oh * s * w + ow * s) * c;
        for (int64_t kh = 0; kh < k; ++kh) {
          for (int64_t kw = 0; kw < k; ++kw) {
            T* __restrict d = corner + (kh * w + kw) * c;
            const auto pos = static_cast<uint8_t>(kh * k + kw);
            if (dense) {
              for (int64_t ch = 0; ch < c; ++ch) d[ch] = idx[ch] == pos ? go[ch] : T(0);
            } else {  // overlapping windows: a cell may win in several, so accumulate
              for (int64_t ch = 0; ch < c; ++ch) d[ch] += idx[ch] == pos ? go[ch] : T(0);
            }
          }
        }
      }
    }
  }
  return dx_;
}

// ---- Global average pool ------------------------------------------------------------------
template <class T>
Shape GlobalAvgPool<T>::setup(const Shape& in, ParamStore<T>&, const std::string&) {
  HPC_CHECK(in.rank() == 3, "global_avg_pool expects H x W x C input, got ", in.str());
  hw_ = in[0] * in[1];
  c_ = in[2];
  return Shape{c_};
}

template <class T>
const Tensor& GlobalAvgPool<T>::forward(const Tensor& x, bool /*train*/) {
  const int64_t n = x.shape()[0];
  y_.resize<T>(Shape{n, c_});
  dx_.resize<T>(x.shape());
  const T* xp = x.data<T>();
  T* yp = y_.data<T>();
  const T inv = T(1) / static_cast<T>(hw_);
  for (int64_t b = 0; b < n; ++b) {
    T* out = yp + b * c_;
    std::fill(out, out + c_, T(0));
    for (int64_t p = 0; p < hw_; ++p) {
      const T* in = xp + (b * hw_ + p) * c_;
      for (int64_t ch = 0; ch < c_; ++ch) out[ch] += in[ch];
    }
    for (int64_t ch = 0; ch < c_; ++ch) out[ch] *= inv;
  }
  return y_;
}

template <class T>
const Tensor& GlobalAvgPool<T>::backward(const Tensor& dy, bool need_dx) {
  if (!need_dx) return dx_;
  const int64_t n = dy.shape()[0];
  const T* g = dy.data<T>();
  T* dxp = dx_.data<T>();
  const T inv = T(1) / static_cast<T>(hw_);
  for (int64_t b = 0; b < n; ++b)
    for (int64_t p = 0; p < hw_; ++p) {
      T* out = dxp + (b * hw_ + p) * c_;
      for (int64_t ch = 0; ch < c_; ++ch) out[ch] = g[b * c_ + ch] * inv;
    }
  return dx_;
}

// ---- Flatten: NHWC is already contiguous per sample, so this is a change of shape only ----
template <class T>
Shape Flatten<T>::setup(const Shape& in, ParamStore<T>&, const std::string&) {
  in_ = in;
  return Shape{in.numel()};
}

template <class T>
const Tensor& Flatten<T>::forward(const Tensor& x, bool /*train*/) {
  y_ = x.reshape(Shape{x.shape()[0], in_.numel()});
  return y_;
}

template <class T>
const Tensor& Flatten<T>::backward(const Tensor& dy, bool need_dx) {
  if (need_dx) dx_ = dy.reshape(batch_shape(dy.shape()[0], in_));
  return dx_;
}

// ---- Linear: y = x W^T + b, W is out x in -------------------------------------------------
template <class T>
Shape Linear<T>::setup(const Shape& in, ParamStore<T>& store, const std::string& prefix) {
  HPC_CHECK(in.rank() == 1, "linear expects flat features, got ", in.str(), " (add a flatten)");
  in_ = in[0];
  store_ = &store;
  weight_ = store.add_param(prefix + ".weight", Shape{out_, in_}, ParamRole::Weight, in_);
  if (has_bias_) bias_ = store.add_param(prefix + ".bias", Shape{out_}, ParamRole::Bias, in_);
  return Shape{out_};
}

template <class T>
const Tensor& Linear<T>::forward(const Tensor& x, bool /*train*/) {
  const int64_t n = x.shape()[0];
  HPC_CHECK(x.shape() == Shape({n, in_}), "linear input ", x.shape().str());
  x_ = x;
  y_.resize<T>(Shape{n, out_});
  T* yp = y_.data<T>();
  T beta = 0;
  if (has_bias_) {
    const T* b = store_->value(bias_);
    bias_rows(yp, n, out_, b);
    beta = 1;
  }
  gemm(false, true, n, out_, in_, T(1), x.data<T>(), in_, store_->value(weight_), in_, beta, yp, out_);
  return y_;
}

template <class T>
const Tensor& Linear<T>::backward(const Tensor& dy, bool need_dx) {
  const int64_t n = x_.shape()[0];
  const T* g = dy.data<T>();
  gemm(true, false, out_, in_, n, T(1), g, out_, x_.data<T>(), in_, T(0), store_->grad(weight_), in_);
  if (has_bias_) bias_gradient(g, n, out_, store_->grad(bias_));
  if (need_dx) {
    dx_.resize<T>(Shape{n, in_});
    gemm(false, false, n, in_, out_, T(1), g, out_, store_->value(weight_), in_, T(0), dx_.data<T>(), in_);
  }
  return dx_;
}

#define HPC_INSTANTIATE(L) template class L<float>; template class L<double>;
HPC_INSTANTIATE(ReLU)
HPC_INSTANTIATE(MaxPool2d)
HPC_INSTANTIATE(GlobalAvgPool)
HPC_INSTANTIATE(Flatten)
HPC_INSTANTIATE(Linear)
#undef HPC_INSTANTIATE

}  // namespace hpc::nn

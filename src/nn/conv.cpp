// Convolution as im2col + GEMM over NHWC activations. Rows of the column matrix are output
// pixels, columns are (kh, kw, cin), so each row is built from KH*KW contiguous copies of Cin
// channels, and the whole batch's pixels form one tall GEMM (M = N*Ho*Wo), which keeps the
// BLAS kernels busy even for small images. Weights are Cout x (KH*KW*Cin).
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "nn/gemm.hpp"
#include "nn/layer.hpp"

namespace hpc::nn {
namespace {
// Column matrices up to this size are kept from forward to backward (no second im2col);
// larger ones are built chunk by chunk, in forward and again in backward, to bound memory.
constexpr int64_t kKeepColumnElems = int64_t{1} << 23;  // 32 MiB of float
constexpr int64_t kChunkElems = int64_t{1} << 20;       // 4 MiB of float per chunk
}  // namespace

template <class T>
Shape Conv2d<T>::setup(const Shape& in, ParamStore<T>& store, const std::string& prefix) {
  HPC_CHECK(in.rank() == 3, "conv2d expects H x W x C input, got ", in.str());
  h_ = in[0];
  w_ = in[1];
  cin_ = in[2];
  ho_ = (h_ + 2 * spec_.padding - spec_.kernel) / spec_.stride + 1;
  wo_ = (w_ + 2 * spec_.padding - spec_.kernel) / spec_.stride + 1;
  HPC_CHECK(ho_ > 0 && wo_ > 0, "conv2d output would be empty for input ", in.str());
  k_ = spec_.kernel * spec_.kernel * cin_;
  store_ = &store;
  weight_ = store.add_param(prefix + ".weight", Shape{spec_.out_channels, spec_.kernel, spec_.kernel, cin_},
                            ParamRole::Weight, k_, spec_.init_gain);
  if (spec_.bias) {
    bias_ = store.add_param(prefix + ".bias", Shape{spec_.out_channels}, ParamRole::Bias, k_, spec_.init_gain);
  }
  return Shape{ho_, wo_, spec_.out_channels};
}

template <class T>
double Conv2d<T>::forward_flops() const {
  return 2.0 * static_cast<double>(ho_ * wo_ * spec_.out_channels * k_);
}

template <class T>
bool Conv2d<T>::direct() const {
  return spec_.kernel == 1 && spec_.stride == 1 && spec_.padding == 0;
}

template <class T>
int64_t Conv2d<T>::images_per_chunk() const {
  return std::max<int64_t>(1, kChunkElems / (ho_ * wo_ * k_));
}

template <class T>
void Conv2d<T>::im2col(const T* x, int64_t images, T* col) const {
  const int64_t kk = spec_.kernel, s = spec_.stride, p = spec_.padding;
  for (int64_t n = 0; n < images; ++n) {
    const T* xn = x + n * h_ * w_ * cin_;
    for (int64_t oh = 0; oh < ho_; ++oh) {
      for (int64_t ow = 0; ow < wo_; ++ow) {
        T* row = col + ((n * ho_ + oh) * wo_ + ow) * k_;
        for (int64_t kh = 0; kh < kk; ++kh) {
          const int64_t ih = oh * s - p + kh;
          for (int64_t kw = 0; kw < kk; ++kw, row += cin_) {
            const int64_t iw = ow * s - p + kw;
            // Plain loops, not memcpy: rows are short (Cin floats) and the call costs more.
            if (ih < 0 || ih >= h_ || iw < 0 || iw >= w_) {
              for (int64_t c = 0; c < cin_; ++c) row[c] = T(0);
            } else {
              const T* src = xn + (ih * w_ + iw) * cin_;
              for (int64_t c = 0; c < cin_; ++c) row[c] = src[c];
            }
          }
        }
      }
    }
  }
}

template <class T>
void Conv2d<T>::col2im(const T* col, int64_t images, T* dx) const {
  const int64_t kk = spec_.kernel, s = spec_.stride, p = spec_.padding;
  for (int64_t n = 0; n < images; ++n) {
    T* dxn = dx + n * h_ * w_ * cin_;
    for (int64_t oh = 0; oh < ho_; ++oh) {
      for (int64_t ow = 0; ow < wo_; ++ow) {
        const T* row = col + ((n * ho_ + oh) * wo_ + ow) * k_;
        for (int64_t kh = 0; kh < kk; ++kh) {
          const int64_t ih = oh * s - p + kh;
          for (int64_t kw = 0; kw < kk; ++kw, row += cin_) {
            const int64_t iw = ow * s - p + kw;
            if (ih < 0 || ih >= h_ || iw < 0 || iw >= w_) continue;
            T* d = dxn + (ih * w_ + iw) * cin_;
            for (int64_t c = 0; c < cin_; ++c) d[c] += row[c];
          }
        }
      }
    }
  }
}

template <class T>
LibraryConv* Conv2d<T>::library(int64_t batch) {
  if constexpr (!std::is_same_v<T, float>) {
    return nullptr;
  } else {
    if (!spec_.library) return nullptr;
    auto it = library_.find(batch);
    if (it == library_.end()) {
      const ConvGeometry g{batch, h_, w_, cin_, spec_.out_channels, spec_.kernel, spec_.stride, spec_.padding, spec_.bias};
      std::unique_ptr<LibraryConv> conv;
      if (spec_.winograd && winograd_fits(g)) conv = make_winograd_conv(g, spec_.winograd_tile);
      else if (spec_.narrow && narrow_fits(g)) conv = make_narrow_conv(g);
      else conv = make_library_conv(g);
      it = library_.emplace(batch, std::move(conv)).first;
    }
    return it->second.get();
  }
}

template <class T>
const Tensor& Conv2d<T>::forward(const Tensor& x, bool /*train*/) {
  const int64_t n = x.shape()[0], cout = spec_.out_channels;
  HPC_CHECK(x.shape() == batch_shape(n, Shape{h_, w_, cin_}), "conv2d input ", x.shape().str());
  x_ = x;
  y_.resize<T>(Shape{n, ho_, wo_, cout});
  const T* xp = x.data<T>();
  T* yp = y_.data<T>();
  const T* wp = store_->value(weight_);
  const int64_t pix = ho_ * wo_;
  if constexpr (std::is_same_v<T, float>) {
    LibraryConv* lib = library(n);
    if (lib && lib->forward(xp, wp, bias_ >= 0 ? store_->value(bias_) : nullptr, yp)) {
      col_kept_ = false;
      return y_;
    }
  }
  T beta = 0;
  if (bias_ >= 0) {  // start from the bias and let the GEMM accumulate onto it
    const T* b = store_->value(bias_);
    bias_rows(yp, n * pix, cout, b);
    beta = 1;
  }
  if (direct()) {
    gemm(false, true, n * pix, cout, k_, T(1), xp, k_, wp, k_, beta, yp, cout);
    return y_;
  }
  col_kept_ = n * pix * k_ <= kKeepColumnElems;
  const int64_t chunk = col_kept_ ? n : std::min(n, images_per_chunk());
  col_.resize<T>(Shape{chunk * pix, k_});
  for (int64_t i0 = 0; i0 < n; i0 += chunk) {
    const int64_t ni = std::min(chunk, n - i0);
    T* col = col_.data<T>();
    im2col(xp + i0 * h_ * w_ * cin_, ni, col);
    gemm(false, true, ni * pix, cout, k_, T(1), col, k_, wp, k_, beta, yp + i0 * pix * cout, cout);
  }
  return y_;
}

template <class T>
const Tensor& Conv2d<T>::backward(const Tensor& dy, bool need_dx) {
  const int64_t n = x_.shape()[0];
  HPC_CHECK(dy.shape() == y_.shape(), "conv2d gradient ", dy.shape().str(), " for output ", y_.shape().str());
  const T* dyp = dy.data<T>();
  bool weights_done = false, data_done = false;
  if (need_dx) dx_.resize<T>(x_.shape());
  if constexpr (std::is_same_v<T, float>) {
    if (LibraryConv* lib = library(n)) {
      weights_done = lib->backward_weights(x_.data<T>(), dyp, store_->grad(weight_),
                                           bias_ >= 0 ? store_->grad(bias_) : nullptr);
      data_done = need_dx && lib->backward_data(dyp, store_->value(weight_), dx_.data<T>());
    }
  }
  if (!weights_done) backward_weights_im2col(dyp, n);
  if (need_dx && !data_done) backward_data_im2col(dyp, n);
  return dx_;
}

template <class T>
void Conv2d<T>::backward_weights_im2col(const T* dyp, int64_t n) {
  const int64_t cout = spec_.out_channels, pix = ho_ * wo_;
  const T* xp = x_.data<T>();
  T* dw = store_->grad(weight_);
  if (bias_ >= 0) bias_gradient(dyp, n * pix, cout, store_->grad(bias_));
  if (direct()) {
    gemm(true, false, cout, k_, n * pix, T(1), dyp, cout, xp, k_, T(0), dw, k_);
    return;
  }
  const int64_t chunk = col_kept_ ? n : std::min(n, images_per_chunk());
  col_.resize<T>(Shape{chunk * pix, k_});
  for (int64_t i0 = 0; i0 < n; i0 += chunk) {
    const int64_t ni = std::min(chunk, n - i0);
    T* col = col_.data<T>();
    if (!col_kept_) im2col(xp + i0 * h_ * w_ * cin_, ni, col);
    gemm(true, false, cout, k_, ni * pix, T(1), dyp + i0 * pix * cout, cout, col, k_, T(i0 == 0 ? 0 : 1), dw, k_);
  }
}

template <class T>
void Conv2d<T>::backward_data_im2col(const T* dyp, int64_t n) {
  const int64_t cout = spec_.out_channels, pix = ho_ * wo_;
  const T* wp = store_->value(weight_);
  if (direct()) {
    gemm(false, false, n * pix, k_, cout, T(1), dyp, cout, wp, k_, T(0), dx_.data<T>(), k_);
    return;
  }
  dx_.fill_zero();  // col2im accumulates
  const int64_t chunk = std::min(n, images_per_chunk());
  dcol_.resize<T>(Shape{chunk * pix, k_});
  for (int64_t i0 = 0; i0 < n; i0 += chunk) {
    const int64_t ni = std::min(chunk, n - i0);
    gemm(false, false, ni * pix, k_, cout, T(1), dyp + i0 * pix * cout, cout, wp, k_, T(0), dcol_.data<T>(), k_);
    col2im(dcol_.data<T>(), ni, dx_.data<T>() + i0 * h_ * w_ * cin_);
  }
}

template class Conv2d<float>;
template class Conv2d<double>;

}  // namespace hpc::nn

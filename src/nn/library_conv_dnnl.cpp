#include <dnnl.hpp>

#include <cstring>
#include <optional>
#include <unordered_map>

#include "core/log.hpp"
#include "nn/library_conv.hpp"

namespace hpc::nn {
namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

dnnl::engine& cpu_engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

// oneDNN's reference kernels ("ref:any") are far slower than our im2col path: a direction
// served only by them is left to Conv2d.
bool is_fast(const char* impl) { return std::strncmp(impl, "ref", 3) != 0; }

class DnnlConv final : public LibraryConv {
 public:
  explicit DnnlConv(const ConvGeometry& g) : stream_(cpu_engine()) {
    auto& eng = cpu_engine();
    const int64_t ho = (g.h + 2 * g.padding - g.kernel) / g.stride + 1;
    const int64_t wo = (g.w + 2 * g.padding - g.kernel) / g.stride + 1;
    src_md_ = {{g.n, g.cin, g.h, g.w}, dt::f32, tag::nhwc};
    dst_md_ = {{g.n, g.cout, ho, wo}, dt::f32, tag::nhwc};
    user_w_md_ = {{g.cout, g.cin, g.kernel, g.kernel}, dt::f32, tag::ohwi};
    const dnnl::memory::desc any_w{{g.cout, g.cin, g.kernel, g.kernel}, dt::f32, tag::any};
    bias_md_ = g.bias ? dnnl::memory::desc({g.cout}, dt::f32, tag::a) : dnnl::memory::desc();
    has_bias_ = g.bias;
    const dnnl::memory::dims strides{g.stride, g.stride}, pad{g.padding, g.padding};
    const auto algo = dnnl::algorithm::convolution_direct;

    fwd_pd_ = dnnl::convolution_forward::primitive_desc(
        dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algo, src_md_, any_w, bias_md_, dst_md_,
                                        strides, pad, pad),
        eng);
    if (is_fast(fwd_pd_.impl_info_str())) {
      fwd_ = dnnl::convolution_forward(fwd_pd_);
      fwd_w_ = dnnl::memory(fwd_pd_.weights_desc(), eng);
      to_fwd_w_ = dnnl::reorder(dnnl::reorder::primitive_desc(eng, user_w_md_, eng, fwd_pd_.weights_desc()));
    }
    auto bd_pd = dnnl::convolution_backward_data::primitive_desc(
        dnnl::convolution_backward_data::desc(algo, src_md_, any_w, dst_md_, strides, pad, pad), eng, fwd_pd_);
    if (is_fast(bd_pd.impl_info_str())) {
      bwd_data_ = dnnl::convolution_backward_data(bd_pd);
      bd_w_ = dnnl::memory(bd_pd.weights_desc(), eng);
      to_bd_w_ = dnnl::reorder(dnnl::reorder::primitive_desc(eng, user_w_md_, eng, bd_pd.weights_desc()));
    }
    auto bw_pd = dnnl::convolution_backward_weights::primitive_desc(
        dnnl::convolution_backward_weights::desc(algo, src_md_, any_w, bias_md_, dst_md_, strides, pad, pad), eng,
        fwd_pd_);
    if (is_fast(bw_pd.impl_info_str())) {
      bwd_weights_ = dnnl::convolution_backward_weights(bw_pd);
      bw_dw_ = dnnl::memory(bw_pd.diff_weights_desc(), eng);
      from_bw_dw_ = dnnl::reorder(dnnl::reorder::primitive_desc(eng, bw_pd.diff_weights_desc(), eng, user_w_md_));
    }
  }

  bool forward(const float* x, const float* w, const float* b, float* y) override {
    if (!fwd_) return false;
    dnnl::memory user = user_w(w);
    to_fwd_w_->execute(stream_, user, fwd_w_);  // weights change every step
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, mem(src_md_, x)},
                                               {DNNL_ARG_WEIGHTS, fwd_w_},
                                               {DNNL_ARG_DST, mem(dst_md_, y)}};
    if (has_bias_) args[DNNL_ARG_BIAS] = mem(bias_md_, b);
    fwd_->execute(stream_, args);
    stream_.wait();
    return true;
  }

  bool backward_data(const float* dy, const float* w, float* dx) override {
    if (!bwd_data_) return false;
    dnnl::memory user = user_w(w);
    to_bd_w_->execute(stream_, user, bd_w_);
    bwd_data_->execute(stream_, {{DNNL_ARG_DIFF_DST, mem(dst_md_, dy)},
                                 {DNNL_ARG_WEIGHTS, bd_w_},
                                 {DNNL_ARG_DIFF_SRC, mem(src_md_, dx)}});
    stream_.wait();
    return true;
  }

  bool backward_weights(const float* x, const float* dy, float* dw, float* db) override {
    if (!bwd_weights_) return false;
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, mem(src_md_, x)},
                                               {DNNL_ARG_DIFF_DST, mem(dst_md_, dy)},
                                               {DNNL_ARG_DIFF_WEIGHTS, bw_dw_}};
    if (has_bias_) args[DNNL_ARG_DIFF_BIAS] = mem(bias_md_, db);
    bwd_weights_->execute(stream_, args);
    dnnl::memory user = user_w(dw);
    from_bw_dw_->execute(stream_, bw_dw_, user);
    stream_.wait();
    return true;
  }

 private:
  // oneDNN memory objects over our buffers (no copy); it takes non-const handles.
  dnnl::memory mem(const dnnl::memory::desc& md, const float* p) {
    return dnnl::memory(md, cpu_engine(), const_cast<float*>(p));
  }
  dnnl::memory user_w(const float* p) { return mem(user_w_md_, p); }

  dnnl::stream stream_;
  dnnl::memory::desc src_md_, dst_md_, user_w_md_, bias_md_;
  bool has_bias_ = false;
  dnnl::convolution_forward::primitive_desc fwd_pd_;
  std::optional<dnnl::convolution_forward> fwd_;
  std::optional<dnnl::convolution_backward_data> bwd_data_;
  std::optional<dnnl::convolution_backward_weights> bwd_weights_;
  dnnl::memory fwd_w_, bd_w_, bw_dw_;
  std::optional<dnnl::reorder> to_fwd_w_, to_bd_w_, from_bw_dw_;
};

}  // namespace

std::unique_ptr<LibraryConv> make_library_conv(const ConvGeometry& g) {
  try {
    return std::make_unique<DnnlConv>(g);
  } catch (const dnnl::error& e) {
    log::debug("oneDNN has no convolution for this shape (", e.what(), "); using im2col + GEMM");
    return nullptr;
  }
}

const char* library_conv_name() { return "onednn"; }

}  // namespace hpc::nn

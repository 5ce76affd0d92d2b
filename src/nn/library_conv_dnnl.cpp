#include <dnnl.hpp>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <unordered_map>

#include "core/log.hpp"
#include "nn/dnnl_kernels.hpp"
#include "nn/library_conv.hpp"
#include "nn/parallel.hpp"

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
    batch_ = g.n, sample_in_ = g.h * g.w * g.cin, sample_out_ = ho * wo * g.cout;
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
    groups_ = std::min<int64_t>(g.n, kWeightGroups);
    for (int64_t i = 0; i < groups_; ++i) {
      const int64_t samples = group_end(i) - group_begin(i);
      if (!group_passes_.count(samples)) group_passes_.emplace(samples, WeightPass(g, samples, ho, wo));
      if (!group_passes_.at(samples).fast) return;  // (a slow one: Conv2d's im2col instead)
    }
    weights_fast_ = true;
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

  // The weight gradient is a sum over the samples, which oneDNN splits among its threads by
  // their number: it is summed here over a fixed split of the batch into groups (one
  // single-threaded oneDNN pass each, inside the parallel region), added in group order, so it
  // has the same bits on any number of threads.
  bool backward_weights(const float* x, const float* dy, float* dw, float* db) override {
    if (!weights_fast_) return false;
    const int64_t wsize = user_w_md_.get_size() / sizeof(float), bsize = has_bias_ ? bias_md_.get_size() / sizeof(float) : 0;
    // (each group's pass writes all of its part: none is cleared first)
    const auto sums = std::make_unique_for_overwrite<float[]>(static_cast<size_t>((groups_ - 1) * (wsize + bsize)));
    each_on_one_thread(groups_, [&](int64_t i) {
      float* gw = i == 0 ? dw : sums.get() + (i - 1) * (wsize + bsize);
      float* gb = !has_bias_ ? nullptr : i == 0 ? db : gw + wsize;
      group_passes_.at(group_end(i) - group_begin(i))
          .run(x + group_begin(i) * sample_in_, dy + group_begin(i) * sample_out_, gw, gb);
    });
    for (int64_t i = 1; i < groups_; ++i) {
      const float* gw = sums.get() + (i - 1) * (wsize + bsize);
      for (int64_t j = 0; j < wsize; ++j) dw[j] += gw[j];
      for (int64_t j = 0; j < bsize; ++j) db[j] += gw[wsize + j];
    }
    return true;
  }

 private:
  // oneDNN memory objects over our buffers (no copy); it takes non-const handles.
  dnnl::memory mem(const dnnl::memory::desc& md, const float* p) {
    return dnnl::memory(md, cpu_engine(), const_cast<float*>(p));
  }
  dnnl::memory user_w(const float* p) { return mem(user_w_md_, p); }

  // One group's weight gradient: oneDNN's pass for `samples` samples into the user's layout,
  // with its own stream and scratchpad, so that groups run side by side.
  struct WeightPass {
    WeightPass(const ConvGeometry& g, int64_t samples, int64_t ho, int64_t wo) {
      auto& eng = cpu_engine();
      src = {{samples, g.cin, g.h, g.w}, dt::f32, tag::nhwc};
      dst = {{samples, g.cout, ho, wo}, dt::f32, tag::nhwc};
      user_w = {{g.cout, g.cin, g.kernel, g.kernel}, dt::f32, tag::ohwi};
      bias = g.bias ? dnnl::memory::desc({g.cout}, dt::f32, tag::a) : dnnl::memory::desc();
      const dnnl::memory::desc any_w{{g.cout, g.cin, g.kernel, g.kernel}, dt::f32, tag::any};
      const dnnl::memory::dims strides{g.stride, g.stride}, pad{g.padding, g.padding};
      const auto algo = dnnl::algorithm::convolution_direct;
      dnnl::primitive_attr attr;
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      // Planned for one thread: a pass runs on one (a kernel planned for more waits at its
      // barriers for threads that never come).
      const OneMathThread one;
      const dnnl::convolution_forward::primitive_desc hint(
          dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algo, src, any_w, bias, dst, strides, pad, pad),
          eng);
      const dnnl::convolution_backward_weights::primitive_desc pd(
          dnnl::convolution_backward_weights::desc(algo, src, any_w, bias, dst, strides, pad, pad), attr, eng, hint);
      fast = is_fast(pd.impl_info_str());
      if (!fast) return;
      pass = dnnl::convolution_backward_weights(pd);
      lib_w = pd.diff_weights_desc();
      scratch = pd.scratchpad_desc();
      to_user = dnnl::reorder(dnnl::reorder::primitive_desc(eng, lib_w, eng, user_w));
    }
    void run(const float* x, const float* dy, float* dw, float* db) const {
      auto& eng = cpu_engine();
      dnnl::stream stream(eng);
      dnnl::memory lib(lib_w, eng), pad(scratch, eng);
      auto over = [&](const dnnl::memory::desc& md, const float* p) { return dnnl::memory(md, eng, const_cast<float*>(p)); };
      std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, over(src, x)},
                                                 {DNNL_ARG_DIFF_DST, over(dst, dy)},
                                                 {DNNL_ARG_DIFF_WEIGHTS, lib},
                                                 {DNNL_ARG_SCRATCHPAD, pad}};
      if (db) args[DNNL_ARG_DIFF_BIAS] = over(bias, db);
      pass.execute(stream, args);
      dnnl::memory user = over(user_w, dw);
      to_user.execute(stream, lib, user);
      stream.wait();
    }
    bool fast = false;
    dnnl::memory::desc src, dst, user_w, bias, lib_w, scratch;
    dnnl::convolution_backward_weights pass;
    dnnl::reorder to_user;
  };
  // Groups of the batch for the weight gradient: at most 8, so that their sums (8 copies of the
  // weights, made for the call) stay small beside the step's own memory.
  static constexpr int64_t kWeightGroups = 8;
  int64_t group_begin(int64_t i) const { return batch_ * i / groups_; }
  int64_t group_end(int64_t i) const { return batch_ * (i + 1) / groups_; }

  dnnl::stream stream_;
  dnnl::memory::desc src_md_, dst_md_, user_w_md_, bias_md_;
  bool has_bias_ = false;
  int64_t batch_ = 0, groups_ = 1, sample_in_ = 0, sample_out_ = 0;
  dnnl::convolution_forward::primitive_desc fwd_pd_;
  std::optional<dnnl::convolution_forward> fwd_;
  std::optional<dnnl::convolution_backward_data> bwd_data_;
  std::map<int64_t, WeightPass> group_passes_;  // by samples in a group (at most two sizes)
  bool weights_fast_ = false;
  dnnl::memory fwd_w_, bd_w_;
  std::optional<dnnl::reorder> to_fwd_w_, to_bd_w_;
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
std::string library_conv_kernels() { return detail::dnnl_kernels(); }

}  // namespace hpc::nn

// Layers: forward and backward on the CPU, templated on the scalar type so the same code runs
// in float for training and in double for the finite-difference gradient checks.
//
// Activations are NHWC (channels last): a convolution's im2col rows are then contiguous
// copies of Cin channels, batch norm sees an M x C matrix, and the flatten before a linear
// layer is free. Tensors of features are N x F, which is NHWC with H = W = 1.
//
// Contract of every layer:
//  - setup(in) declares parameters/buffers in the store and returns the per-sample output
//    shape ({H, W, C} or {F}); it runs once, before the arenas are allocated.
//  - forward(x, train) returns a reference to the layer's own output buffer, valid until its
//    next forward. The layer may keep a handle to x: the caller keeps x alive and unchanged
//    until backward.
//  - backward(dy, need_dx) OVERWRITES (not accumulates) the layer's parameter gradients, and
//    returns dx when need_dx (the first layer skips the input gradient: it is never used).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/arena.hpp"
#include "core/tensor.hpp"
#include "nn/library_conv.hpp"

namespace hpc::nn {

// Sums n doubles over every rank of a data-parallel job, in place: how batch norm shares its
// statistics across ranks (--sync-batch-norm). nn knows nothing of MPI; the trainer hands
// this in.
using StatsSum = std::function<void(double* data, int64_t n)>;

template <class T> class Conv2d;
template <class T> class BatchNorm;
template <class T> class ReLU;
template <class T> class MaxPool2d;
template <class T> class GlobalAvgPool;
template <class T> class Flatten;
template <class T> class Linear;
template <class T> class Sequential;
template <class T> class Residual;

// Every kind of layer, for the code that gives a model another form: the GPU mirror
// (nn/cuda/network.cpp) and the ONNX graph (export/onnx_export.cpp). Each form implements every
// visit, so a layer kind added here without its GPU or ONNX form does not compile (the form's
// visitor stays abstract); a layer's accept() calls the visit of its own kind.
template <class T>
class LayerVisitor {
 public:
  virtual ~LayerVisitor() = default;
  virtual void visit(const Conv2d<T>& l) = 0;
  virtual void visit(const BatchNorm<T>& l) = 0;
  virtual void visit(const ReLU<T>& l) = 0;
  virtual void visit(const MaxPool2d<T>& l) = 0;
  virtual void visit(const GlobalAvgPool<T>& l) = 0;
  virtual void visit(const Flatten<T>& l) = 0;
  virtual void visit(const Linear<T>& l) = 0;
  virtual void visit(const Sequential<T>& l) = 0;
  virtual void visit(const Residual<T>& l) = 0;
};

template <class T>
class Layer {
 public:
  virtual ~Layer() = default;
  virtual std::string kind() const = 0;
  virtual Shape setup(const Shape& in, ParamStore<T>& store, const std::string& prefix) = 0;
  virtual const Tensor& forward(const Tensor& x, bool train) = 0;
  virtual const Tensor& backward(const Tensor& dy, bool need_dx) = 0;
  // Per-sample forward multiply-adds x 2 (for GFLOP/s reports); 0 for cheap layers.
  virtual double forward_flops() const { return 0; }
  // Multiply-adds x 2 of backward; by default twice the forward (input and weight gradients).
  virtual double backward_flops(bool need_dx) const { return forward_flops() * (need_dx ? 2 : 1); }
  // Batch statistics over all ranks from now on (layers that have none ignore it).
  virtual void sync_statistics(const StatsSum& /*sum*/) {}
  // v.visit(*this): the visit of this layer's kind.
  virtual void accept(LayerVisitor<T>& v) const = 0;
};

template <class T>
using LayerPtr = std::unique_ptr<Layer<T>>;

// Shape of a batch of n samples with per-sample shape s.
inline Shape batch_shape(int64_t n, const Shape& s) {
  std::vector<int64_t> d{n};
  d.insert(d.end(), s.dims().begin(), s.dims().end());
  return Shape(std::move(d));
}

struct ConvSpec {
  int64_t out_channels = 0, kernel = 3, stride = 1, padding = 1;
  bool bias = true;
  bool library = true;  // float: let the library convolution (library_conv.hpp) serve what it can
  double init_gain = 1;  // scales the Kaiming initialisation of the weights
  bool winograd = true;  // float, with library: our Winograd convolution where it fits (library_conv.hpp)
  bool narrow = true;    // float, with library: our direct kernel for few inputs per output (library_conv.hpp)
  int winograd_tile = 0;  // Winograd F(2x2, 3x3) or F(4x4, 3x3): 2 or 4; 0: winograd_tile() picks
};

template <class T>
class Conv2d final : public Layer<T> {
 public:
  explicit Conv2d(ConvSpec spec) : spec_(spec) {}
  std::string kind() const override { return "conv2d"; }
  void accept(LayerVisitor<T>& v) const override { v.visit(*this); }
  Shape setup(const Shape& in, ParamStore<T>& store, const std::string& prefix) override;
  const Tensor& forward(const Tensor& x, bool train) override;
  const Tensor& backward(const Tensor& dy, bool need_dx) override;
  double forward_flops() const override;
  // For the GPU network, which mirrors this layer (nn/cuda/network.hpp).
  const ConvSpec& spec() const { return spec_; }
  int weight_slot() const { return weight_; }
  int bias_slot() const { return bias_; }  // -1: no bias

 private:
  bool direct() const;  // 1x1, stride 1, no padding: the input is its own im2col matrix

  void im2col(const T* x, int64_t images, T* col) const;
  void col2im(const T* col, int64_t images, T* dx) const;
  int64_t images_per_chunk() const;
  LibraryConv* library(int64_t batch);  // nullptr: im2col + GEMM
  void backward_weights_im2col(const T* dy, int64_t n);
  void backward_data_im2col(const T* dy, int64_t n);

  ConvSpec spec_;
  int64_t h_ = 0, w_ = 0, cin_ = 0, ho_ = 0, wo_ = 0, k_ = 0;  // k_ = kernel*kernel*cin
  ParamStore<T>* store_ = nullptr;
  int weight_ = -1, bias_ = -1;
  Tensor x_, y_, dx_, col_, dcol_;
  std::map<int64_t, std::unique_ptr<LibraryConv>> library_;  // by batch size: shapes are baked in
  bool col_kept_ = false;  // forward kept every chunk's columns for backward
};

// A max pool fused into the batch norm before it (kernel 0: none). Only windows that do not
// overlap (kernel <= stride) fuse: each input cell then feeds at most one output.
struct FusedPool {
  int64_t kernel = 0, stride = 0;
};

// Batch norm with PyTorch's defaults (momentum 0.1, eps 1e-5), optionally followed by a
// fused ReLU (relu = true is exactly BatchNorm then ReLU, in one pass) and a fused max pool
// (exactly BatchNorm [ReLU] MaxPool2d: same outputs, same gradients, summed in the same
// order). Fusing the pool means the full-size normalised activations and their gradient are
// never written: the layer reads its input and writes the pooled output, and backward
// rebuilds each cell's gradient from the pooled gradient and the window's argmax.
template <class T>
class BatchNorm final : public Layer<T> {
 public:
  explicit BatchNorm(bool relu = false, FusedPool pool = {}, double momentum = 0.1, double eps = 1e-5)
      : relu_(relu), pool_(pool), momentum_(momentum), eps_(eps) {}
  std::string kind() const override;
  void accept(LayerVisitor<T>& v) const override { v.visit(*this); }
  Shape setup(const Shape& in, ParamStore<T>& store, const std::string& prefix) override;
  const Tensor& forward(const Tensor& x, bool train) override;
  const Tensor& backward(const Tensor& dy, bool need_dx) override;
  // Statistics (forward) and gradient sums (backward) over the whole global batch: the
  // SyncBatchNorm of PyTorch. Parameter gradients stay per rank (the all-reduce averages them).
  void sync_statistics(const StatsSum& sum) override { sync_ = sum; }
  // For the GPU network, which mirrors this layer (nn/cuda/network.hpp).
  bool fused_relu() const { return relu_; }
  FusedPool fused_pool() const { return pool_; }
  double momentum() const { return momentum_; }
  double eps() const { return eps_; }
  int gamma_slot() const { return gamma_; }
  int beta_slot() const { return beta_; }
  int running_mean_slot() const { return running_mean_; }
  int running_var_slot() const { return running_var_; }

 private:
  bool pooled() const { return pool_.kernel > 0; }
  void statistics(const T* xp, int64_t m, bool train);  // sets mean_, invstd_, scale_, shift_, count_
  // Sums of x - shift and its square per channel over the m rows of xp, in double.
  void shifted_sums(const T* xp, int64_t m, const T* shift, std::vector<double>& s1, std::vector<double>& s2);
  void pool_forward(const T* xp, int64_t n);
  // Two per-channel sums over the m rows, in parallel and in blocks: rows(b, e, s1, s2) adds
  // rows [b, e) into s1 and s2; the totals land in out1 and out2 (double).
  template <class RowSums>
  void row_sums(int64_t m, std::vector<double>& out1, std::vector<double>& out2, RowSums&& rows);
  // Backward: sum g and sum g (x - mean) per channel, g the gradient reaching the normalised
  // output (dyp through the fused ReLU and pool); then dx_ from those sums.
  void gradient_sums(const T* dyp, std::vector<double>& sdy, std::vector<double>& sdyx);
  void input_gradient(const T* dyp, const std::vector<double>& sdy, const std::vector<double>& sdyx);

  bool relu_;
  FusedPool pool_;
  double momentum_, eps_;
  int64_t c_ = 0, h_ = 0, w_ = 0, ho_ = 0, wo_ = 0;  // h_.. only with a fused pool
  ParamStore<T>* store_ = nullptr;
  int gamma_ = -1, beta_ = -1, running_mean_ = -1, running_var_ = -1;
  Tensor x_, y_, dx_, argmax_;
  std::vector<double> mean_, invstd_;
  std::vector<T> scale_, shift_;  // forward's normalisation: x * scale + shift, per channel
  double count_ = 0;                // values per channel the statistics came from (all ranks')
  double rows_weight_ = 1;          // synchronised: this rank's rows over the mean rows of a rank
  StatsSum sync_;
};

template <class T>
class ReLU final : public Layer<T> {
 public:
  std::string kind() const override { return "relu"; }
  void accept(LayerVisitor<T>& v) const override { v.visit(*this); }
  Shape setup(const Shape& in, ParamStore<T>&, const std::string&) override { return in; }
  const Tensor& forward(const Tensor& x, bool train) override;
  const Tensor& backward(const Tensor& dy, bool need_dx) override;

 private:
  Tensor y_, dx_;
};

// kernel x kernel windows at `stride`, `padding` cells on every side that never win (-inf, as
// PyTorch's MaxPool2d: torchvision's ResNet stem is 3x3, stride 2, padding 1).
template <class T>
class MaxPool2d final : public Layer<T> {
 public:
  MaxPool2d(int64_t kernel, int64_t stride, int64_t padding = 0) : kernel_(kernel), stride_(stride), pad_(padding) {}
  std::string kind() const override { return "maxpool2d"; }
  void accept(LayerVisitor<T>& v) const override { v.visit(*this); }
  Shape setup(const Shape& in, ParamStore<T>&, const std::string&) override;
  const Tensor& forward(const Tensor& x, bool train) override;
  const Tensor& backward(const Tensor& dy, bool need_dx) override;
  int64_t kernel() const { return kernel_; }
  int64_t stride() const { return stride_; }
  int64_t padding() const { return pad_; }

 private:
  // The padded pool: each window clipped to the image, one window at a time.
  void padded_forward(const T* xp, T* yp, uint8_t* am, int64_t n) const;
  void padded_backward(const T* g, const uint8_t* am, T* dxp, int64_t n) const;

  int64_t kernel_, stride_, pad_, h_ = 0, w_ = 0, c_ = 0, ho_ = 0, wo_ = 0;
  Tensor y_, dx_, argmax_;
};

template <class T>
class GlobalAvgPool final : public Layer<T> {
 public:
  std::string kind() const override { return "global_avg_pool"; }
  void accept(LayerVisitor<T>& v) const override { v.visit(*this); }
  Shape setup(const Shape& in, ParamStore<T>&, const std::string&) override;
  const Tensor& forward(const Tensor& x, bool train) override;
  const Tensor& backward(const Tensor& dy, bool need_dx) override;

 private:
  int64_t hw_ = 0, c_ = 0;
  Tensor y_, dx_;
};

template <class T>
class Flatten final : public Layer<T> {
 public:
  std::string kind() const override { return "flatten"; }
  void accept(LayerVisitor<T>& v) const override { v.visit(*this); }
  Shape setup(const Shape& in, ParamStore<T>&, const std::string&) override;
  const Tensor& forward(const Tensor& x, bool train) override;
  const Tensor& backward(const Tensor& dy, bool need_dx) override;

 private:
  Shape in_;
  Tensor y_, dx_;
};

template <class T>
class Linear final : public Layer<T> {
 public:
  explicit Linear(int64_t out_features, bool bias = true) : out_(out_features), has_bias_(bias) {}
  std::string kind() const override { return "linear"; }
  void accept(LayerVisitor<T>& v) const override { v.visit(*this); }
  Shape setup(const Shape& in, ParamStore<T>& store, const std::string& prefix) override;
  const Tensor& forward(const Tensor& x, bool train) override;
  const Tensor& backward(const Tensor& dy, bool need_dx) override;
  double forward_flops() const override { return 2.0 * static_cast<double>(in_ * out_); }
  int weight_slot() const { return weight_; }
  int bias_slot() const { return bias_; }  // -1: no bias

 private:
  int64_t in_ = 0, out_;
  bool has_bias_;
  ParamStore<T>* store_ = nullptr;
  int weight_ = -1, bias_ = -1;
  Tensor x_, y_, dx_;
};

// A chain of layers; itself a layer, so blocks nest.
template <class T>
class Sequential final : public Layer<T> {
 public:
  std::string kind() const override { return "sequential"; }
  void accept(LayerVisitor<T>& v) const override { v.visit(*this); }
  void add(LayerPtr<T> layer) { layers_.push_back(std::move(layer)); }
  bool empty() const { return layers_.empty(); }
  Shape setup(const Shape& in, ParamStore<T>& store, const std::string& prefix) override;
  const Tensor& forward(const Tensor& x, bool train) override;
  const Tensor& backward(const Tensor& dy, bool need_dx) override;
  // backward, calling after_layer(i) as soon as layer i's backward is done (so its
  // parameter gradients are final: the gradient all-reduce starts on them).
  template <class F>
  const Tensor& backward_with(const Tensor& dy, bool need_dx, F&& after_layer) {
    const Tensor* cur = &dy;
    for (size_t i = layers_.size(); i-- > 0;) {
      cur = &layers_[i]->backward(*cur, need_dx || i > 0);
      after_layer(i);
    }
    return *cur;
  }
  double forward_flops() const override;
  double backward_flops(bool need_dx) const override;
  const std::vector<LayerPtr<T>>& layers() const { return layers_; }
  void sync_statistics(const StatsSum& sum) override {
    for (auto& l : layers_) l->sync_statistics(sum);
  }
  // Index of the first parameter slot each layer declared in setup (size: layers + 1).
  const std::vector<size_t>& first_slots() const { return first_slots_; }
  // Per-sample shapes from setup: layer i maps shapes()[i] to shapes()[i + 1].
  const std::vector<Shape>& shapes() const { return shapes_; }

 private:
  std::vector<LayerPtr<T>> layers_;
  std::vector<size_t> first_slots_;
  std::vector<Shape> shapes_;
};

// ResNet basic block: relu(main(x) + shortcut(x)); an empty shortcut is the identity.
// The residual add and its gradient (the same dy flows into both branches) live here.
template <class T>
class Residual final : public Layer<T> {
 public:
  Residual(Sequential<T> main, Sequential<T> shortcut)
      : main_(std::move(main)), shortcut_(std::move(shortcut)) {}
  std::string kind() const override { return "residual"; }
  void accept(LayerVisitor<T>& v) const override { v.visit(*this); }
  Shape setup(const Shape& in, ParamStore<T>& store, const std::string& prefix) override;
  const Tensor& forward(const Tensor& x, bool train) override;
  const Tensor& backward(const Tensor& dy, bool need_dx) override;
  double forward_flops() const override { return main_.forward_flops() + shortcut_.forward_flops(); }
  double backward_flops(bool need_dx) const override {
    return main_.backward_flops(true) + shortcut_.backward_flops(true) * (need_dx ? 1 : 0);
  }
  void sync_statistics(const StatsSum& sum) override {
    main_.sync_statistics(sum);
    shortcut_.sync_statistics(sum);
  }
  const Sequential<T>& main() const { return main_; }
  const Sequential<T>& shortcut() const { return shortcut_; }  // empty: the identity

 private:
  Sequential<T> main_, shortcut_;
  Tensor y_, dsum_, dx_;
};

// Mean softmax cross-entropy over the batch, with optional label smoothing (the target puts
// 1 - s on the label and s / classes on every class, as PyTorch's label_smoothing).
template <class T>
class SoftmaxCrossEntropy {
 public:
  explicit SoftmaxCrossEntropy(double label_smoothing = 0) : smoothing_(label_smoothing) {}
  // logits: N x K; labels: N int32 in [0, K). Returns the mean loss.
  double forward(const Tensor& logits, const int32_t* labels);
  // Gradient of the mean loss with respect to the logits of the last forward.
  const Tensor& backward();
  const Tensor& probabilities() const { return prob_; }

 private:
  double smoothing_;
  const int32_t* labels_ = nullptr;
  Tensor prob_, dlogits_;
};

}  // namespace hpc::nn

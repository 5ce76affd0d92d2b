#include <cmath>
#include <initializer_list>
#include <sstream>

#include "core/rng.hpp"
#include "nn/model.hpp"

namespace hpc::nn {
namespace {

template <class T, class L, class... Args>
void push(Sequential<T>& s, Args&&... args) {
  s.add(std::make_unique<L>(std::forward<Args>(args)...));
}

// conv (+ BN) (+ ReLU). Without BN the convolution carries a bias instead.
template <class T>
void conv_bn(Sequential<T>& s, bool bn, int64_t out, int64_t kernel, int64_t stride, int64_t pad, bool relu,
             bool bias_with_bn = false, double init_gain = 1) {
  ConvSpec spec{out, kernel, stride, pad, !bn || bias_with_bn};
  spec.init_gain = init_gain;
  push<T, Conv2d<T>>(s, spec);
  if (bn) push<T, BatchNorm<T>>(s, relu);  // ReLU fused into the batch norm
  else if (relu) push<T, ReLU<T>>(s);
}

constexpr PoolGeometry kHalving{2, 2, 0};       // the cnn's pools
constexpr PoolGeometry kImageNetStem{3, 2, 1};  // torchvision's resnet (He et al. 2016)

// conv + BN + ReLU + max pool, the pool fused into the batch norm where the spec allows and
// its windows neither overlap nor are padded (what FusedPool takes).
template <class T>
void conv_bn_pool(Sequential<T>& s, const ModelSpec& m, int64_t out, int64_t kernel, int64_t stride, int64_t pad,
                  bool bias_with_bn, PoolGeometry pool) {
  if (m.batch_norm && m.fuse && pool.padding == 0 && pool.kernel <= pool.stride) {
    ConvSpec spec{out, kernel, stride, pad, bias_with_bn};
    push<T, Conv2d<T>>(s, spec);
    push<T, BatchNorm<T>>(s, true, FusedPool{pool.kernel, pool.stride});
    return;
  }
  conv_bn(s, m.batch_norm, out, kernel, stride, pad, true, bias_with_bn);
  push<T, MaxPool2d<T>>(s, pool.kernel, pool.stride, pool.padding);
}

// The model of shared/bench/torch_peer.py. Its convolutions keep their bias even before batch
// norm, as PyTorch's nn.Conv2d default does there.
template <class T>
void build_cnn(Sequential<T>& s, const ModelSpec& m) {
  conv_bn_pool(s, m, 32, 3, 1, 1, true, kHalving);
  conv_bn_pool(s, m, 64, 3, 1, 1, true, kHalving);
  push<T, Flatten<T>>(s);
  push<T, Linear<T>>(s, 128);
  push<T, ReLU<T>>(s);
  push<T, Linear<T>>(s, m.classes);
}

template <class T>
void build_mlp(Sequential<T>& s, const ModelSpec& m) {
  push<T, Flatten<T>>(s);
  for (int64_t width : {512, 256}) {
    push<T, Linear<T>>(s, width, !m.batch_norm);
    if (m.batch_norm) push<T, BatchNorm<T>>(s, true);
    else push<T, ReLU<T>>(s);
  }
  push<T, Linear<T>>(s, m.classes);
}

template <class T>
LayerPtr<T> basic_block(bool bn, int64_t in, int64_t out, int64_t stride) {
  Sequential<T> main, shortcut;
  conv_bn(main, bn, out, 3, stride, 1, true);
  // Without batch norm nothing rescales the sum of branches, and Kaiming-initialised
  // residual branches double the activations' variance block after block (resnet20 starts
  // with losses near 1e15). Starting the branch's last convolution at zero makes each block
  // the identity at first (Fixup, Zhang et al. 2019); with batch norm the usual init stays.
  conv_bn(main, bn, out, 3, 1, 1, false, false, bn ? 1.0 : 0.0);
  if (stride != 1 || in != out) conv_bn(shortcut, bn, out, 1, stride, 0, false);  // projection
  return std::make_unique<Residual<T>>(std::move(main), std::move(shortcut));
}

// Stages of `blocks` basic blocks each, one a width, on the stem's widths[0] channels: every
// stage after the first starts by halving the image (its first block's stride 2).
template <class T>
void basic_stages(Sequential<T>& s, bool bn, std::initializer_list<int64_t> widths, int blocks) {
  int64_t in = *widths.begin();
  for (int64_t width : widths) {
    for (int b = 0; b < blocks; ++b) {
      s.add(basic_block<T>(bn, in, width, (b == 0 && width != *widths.begin()) ? 2 : 1));
      in = width;
    }
  }
}

// The stem of resnet18 and resnet50, 64 channels wide. Small images (<= 64 pixels a side:
// MNIST, CIFAR) get the usual CIFAR stem, a 3x3 convolution without max pool; larger ones the
// ImageNet stem (7x7/2 conv, then a 3x3/2 max pool padded by 1, torchvision's: its 3x3 windows
// overlap, so the pool stays unfused).
template <class T>
void resnet_stem(Sequential<T>& s, const ModelSpec& m) {
  if (m.input[0] <= 64) {
    conv_bn(s, m.batch_norm, 64, 3, 1, 1, true);
  } else {
    conv_bn_pool(s, m, 64, 7, 2, 3, false, kImageNetStem);
  }
}

// The head of every ResNet: the global average of each channel, then the classifier.
template <class T>
void pooled_classifier(Sequential<T>& s, const ModelSpec& m) {
  push<T, GlobalAvgPool<T>>(s);
  push<T, Linear<T>>(s, m.classes);
}

// He et al. 2016, section 4.2: 6n+2 layers on 32x32 images, widths 16/32/64, n = 3.
template <class T>
void build_resnet20(Sequential<T>& s, const ModelSpec& m) {
  conv_bn(s, m.batch_norm, 16, 3, 1, 1, true);
  basic_stages(s, m.batch_norm, {16, 32, 64}, 3);
  pooled_classifier(s, m);
}

// ResNet-18 (He et al. 2016, table 1): stages of 2 basic blocks, widths 64 to 512.
template <class T>
void build_resnet18(Sequential<T>& s, const ModelSpec& m) {
  resnet_stem(s, m);
  basic_stages(s, m.batch_norm, {64, 128, 256, 512}, 2);
  pooled_classifier(s, m);
}

// The bottleneck block of ResNet-50: 1x1 reduce, 3x3 (carrying the stride, as torchvision's
// "v1.5"), 1x1 expand to 4x; the branch's last convolution starts at zero without batch norm.
template <class T>
LayerPtr<T> bottleneck_block(bool bn, int64_t in, int64_t mid, int64_t stride) {
  const int64_t out = 4 * mid;
  Sequential<T> main, shortcut;
  conv_bn(main, bn, mid, 1, 1, 0, true);
  conv_bn(main, bn, mid, 3, stride, 1, true);
  conv_bn(main, bn, out, 1, 1, 0, false, false, bn ? 1.0 : 0.0);
  if (stride != 1 || in != out) conv_bn(shortcut, bn, out, 1, stride, 0, false);  // projection
  return std::make_unique<Residual<T>>(std::move(main), std::move(shortcut));
}

// ResNet-50 (He et al. 2016, table 1): stages of 3, 4, 6, 3 bottleneck blocks; the same stems
// as resnet18 (the ImageNet one above 64 pixels a side).
template <class T>
void build_resnet50(Sequential<T>& s, const ModelSpec& m) {
  resnet_stem(s, m);
  int64_t in = 64;
  const std::pair<int64_t, int> stages[] = {{64, 3}, {128, 4}, {256, 6}, {512, 3}};
  for (const auto& [mid, blocks] : stages) {
    for (int b = 0; b < blocks; ++b) {
      s.add(bottleneck_block<T>(m.batch_norm, in, mid, (b == 0 && mid != 64) ? 2 : 1));
      in = 4 * mid;
    }
  }
  pooled_classifier(s, m);
}

// Every max pool of a network, in order: the separate ones and those fused into a batch norm.
class PoolLister final : public LayerVisitor<float> {
 public:
  std::vector<PoolGeometry> pools;
  void visit(const Conv2d<float>&) override {}
  void visit(const BatchNorm<float>& l) override {
    if (l.fused_pool().kernel > 0) pools.push_back({l.fused_pool().kernel, l.fused_pool().stride, 0});
  }
  void visit(const ReLU<float>&) override {}
  void visit(const MaxPool2d<float>& l) override { pools.push_back({l.kernel(), l.stride(), l.padding()}); }
  void visit(const GlobalAvgPool<float>&) override {}
  void visit(const Flatten<float>&) override {}
  void visit(const Linear<float>&) override {}
  void visit(const Sequential<float>& l) override {
    for (const auto& layer : l.layers()) layer->accept(*this);
  }
  void visit(const Residual<float>& l) override {
    visit(l.main());
    visit(l.shortcut());
  }
};

}  // namespace

std::vector<PoolGeometry> max_pools(const Sequential<float>& net) {
  PoolLister lister;
  lister.visit(net);
  return lister.pools;
}

std::string max_pools_text(const std::vector<PoolGeometry>& pools) {
  std::ostringstream os;
  for (size_t i = 0; i < pools.size(); ++i) {
    const PoolGeometry& p = pools[i];
    os << (i ? "," : "") << p.kernel << 'x' << p.kernel << '/' << p.stride;
    if (p.padding > 0) os << " pad " << p.padding;
  }
  return os.str();
}

int64_t smallest_image_side(ModelKind model) { return model == ModelKind::Cnn ? 4 : 1; }

template <class T>
Model<T>::Model(const ModelSpec& spec) : spec_(spec), loss_(spec.label_smoothing) {
  switch (spec.kind) {
    case ModelKind::Mlp: build_mlp(net_, spec); break;
    case ModelKind::Cnn: build_cnn(net_, spec); break;
    case ModelKind::ResNet20: build_resnet20(net_, spec); break;
    case ModelKind::ResNet18: build_resnet18(net_, spec); break;
    case ModelKind::ResNet50: build_resnet50(net_, spec); break;
  }
  Shape out = net_.setup(spec.input, store_, "");
  HPC_CHECK(out == Shape({spec.classes}), "model ", model_name(spec.kind), " ends in ", out.str());
  store_.allocate();
}

template <class T>
void Model<T>::init(uint64_t seed) {
  const auto& slots = store_.slots();
  for (size_t i = 0; i < slots.size(); ++i) {
    const ParamSlot& s = slots[i];
    T* p = store_.value(static_cast<int>(i));
    const int64_t n = s.shape.numel();
    // Biases are drawn as the weights are under kaiming-uniform, as PyTorch's Conv2d and Linear
    // draw theirs: U(+-gain/sqrt(fan_in)), so a layer of gain 0 still starts at zero.
    const bool drawn = s.role == ParamRole::Weight ||
                       (s.role == ParamRole::Bias && spec_.init == InitScheme::KaimingUniform);
    if (!drawn) {  // zero biases (kaiming-normal), batch-norm scale 1 and shift 0
      const T v = s.role == ParamRole::NormScale ? T(1) : T(0);
      for (int64_t j = 0; j < n; ++j) p[j] = v;
      continue;
    }
    Philox rng(seed, RngStream::Init, i);
    const double fan_in = static_cast<double>(s.fan_in);
    if (spec_.init == InitScheme::KaimingNormal) {
      const double stddev = s.init_gain * std::sqrt(2.0 / fan_in);
      for (int64_t j = 0; j < n; ++j) p[j] = static_cast<T>(rng.normal() * stddev);
    } else {
      const double bound = s.init_gain / std::sqrt(fan_in);
      for (int64_t j = 0; j < n; ++j) p[j] = static_cast<T>((2 * rng.uniform_double() - 1) * bound);
    }
  }
}

template <class T>
double Model<T>::train_step(const Tensor& x, const int32_t* labels) {
  const Tensor& logits = forward(x, true);
  const double l = loss(logits, labels);
  backward();
  return l;
}

template <class T>
std::vector<int64_t> Model<T>::gradient_groups() const {
  std::vector<int64_t> starts;
  const auto& first = net_.first_slots();
  for (size_t i = 0; i + 1 < first.size(); ++i)
    if (first[i + 1] > first[i]) starts.push_back(store_.slots()[first[i]].offset);
  return starts;
}

template <class T>
std::string Model<T>::summary() const {
  std::ostringstream os;
  os << model_name(spec_.kind) << (spec_.batch_norm ? "" : " (no batch norm)") << ": " << store_.param_count()
     << " parameters in " << store_.slots().size() << " tensors, "
     << net_.forward_flops() / 1e6 << " MFLOP forward, " << train_flops_per_sample() / 1e6
     << " MFLOP training per sample";
  return os.str();
}

template class Model<float>;
template class Model<double>;

}  // namespace hpc::nn

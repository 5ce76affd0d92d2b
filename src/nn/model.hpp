// Models by name, and the Model that owns a network, its arenas and its loss.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/choice.hpp"
#include "nn/layer.hpp"

namespace hpc::nn {

// How weights and biases start. KaimingUniform: the init PyTorch gives Conv2d and Linear by
// default, so the peer's model (kaiming_uniform with a = sqrt(5): U(+-1/sqrt(fan_in)), and the
// biases U(+-1/sqrt(fan_in)) too). KaimingNormal: He et al.'s N(0, 2/fan_in), the ReLU gain, and
// zero biases.
enum class InitScheme { KaimingUniform, KaimingNormal };
inline constexpr Named<InitScheme> kInitNames[] = {{"kaiming-uniform", InitScheme::KaimingUniform},
                                                   {"kaiming-normal", InitScheme::KaimingNormal}};

// The model zoo, and the names --model and checkpoints give its models (in --help's order).
enum class ModelKind { Mlp, Cnn, ResNet20, ResNet18, ResNet50 };
inline constexpr Named<ModelKind> kModelNames[] = {{"mlp", ModelKind::Mlp},
                                                   {"cnn", ModelKind::Cnn},
                                                   {"resnet20", ModelKind::ResNet20},
                                                   {"resnet18", ModelKind::ResNet18},
                                                   {"resnet50", ModelKind::ResNet50}};
inline const char* model_name(ModelKind kind) { return name_of(kModelNames, kind); }

struct ModelSpec {
  ModelKind kind = ModelKind::Cnn;
  bool batch_norm = true;     // false: the variant without batch norm (exactness tests)
  Shape input{28, 28, 1};     // per-sample H x W x C
  int64_t classes = 10;
  double label_smoothing = 0;
  // Fuse each batch norm + ReLU + max pool into one layer (identical results, fewer passes
  // over memory); false keeps them as separate layers (tests compare the two).
  bool fuse = true;
  InitScheme init = InitScheme::KaimingUniform;
};

// The smallest image side the model can take (cnn: its two 2x2 max pools need 4 pixels; the
// ResNets end in a global average pool and take any size).
int64_t smallest_image_side(ModelKind model);

// A max pool's geometry, fused into a batch norm or not: kernel x kernel windows at a stride,
// `padding` cells a side that never win.
struct PoolGeometry {
  int64_t kernel, stride, padding;
};
// The network's max pools in order. Checkpoints record them (max_pools_text): the same parameters
// behind another pool are another function, which the parameters' layout alone does not show.
std::vector<PoolGeometry> max_pools(const Sequential<float>& net);
// "3x3/2 pad 1,2x2/2": each pool as kernel, stride and its padding where it has one; "" for none.
std::string max_pools_text(const std::vector<PoolGeometry>& pools);

template <class T>
class Model {
 public:
  explicit Model(const ModelSpec& spec);
  // Weights as spec().init says, drawn from (seed, parameter index) and scaled by each
  // slot's init_gain; biases as spec().init says; batch-norm scale 1 and shift 0. Identical on every machine for a
  // given seed.
  void init(uint64_t seed);
  // Forward of a batch x (N x H x W x C); returns the logits (N x classes).
  const Tensor& forward(const Tensor& x, bool train) { return net_.forward(x, train); }
  // Loss of the last forward against labels, and the gradient of it into the grad arena.
  double loss(const Tensor& logits, const int32_t* labels) { return loss_.forward(logits, labels); }
  void backward() { net_.backward(loss_.backward(), false); }
  // backward, calling grads_ready(offset) whenever every gradient at arena offsets
  // [offset, end) is final (after each top-level layer with parameters).
  template <class F>
  void backward(F&& grads_ready) {
    const auto& first = net_.first_slots();
    net_.backward_with(loss_.backward(), false, [&](size_t i) {
      if (first[i + 1] > first[i]) grads_ready(store_.slots()[first[i]].offset);
    });
  }
  double train_step(const Tensor& x, const int32_t* labels);  // forward + loss + backward
  // Arena offsets at which the top-level layers' parameters begin (ascending): the groups
  // backward completes together.
  std::vector<int64_t> gradient_groups() const;

  // Softmax outputs of the last loss() call (N x classes).
  const Tensor& probabilities() const { return loss_.probabilities(); }
  ParamStore<T>& params() { return store_; }
  const ParamStore<T>& params() const { return store_; }
  const ModelSpec& spec() const { return spec_; }
  Sequential<T>& net() { return net_; }
  const Sequential<T>& net() const { return net_; }
  // Per-sample multiply-add work of one training step (forward + backward) x 2.
  double train_flops_per_sample() const { return net_.forward_flops() + net_.backward_flops(false); }
  std::string summary() const;
  // Batch norm statistics over every rank (sum adds doubles over the ranks).
  void sync_batch_norm(const StatsSum& sum) { net_.sync_statistics(sum); }

 private:
  ModelSpec spec_;
  Sequential<T> net_;
  ParamStore<T> store_;
  SoftmaxCrossEntropy<T> loss_;
};

}  // namespace hpc::nn

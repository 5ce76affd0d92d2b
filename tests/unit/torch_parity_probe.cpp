// What the CPU trainer computes, for torch_parity_test.py to recompute with PyTorch: the zoo's
// models (every layer kind, forward and backward, in float as training runs them), the loss with
// label smoothing, SGD's update with its decay table, the learning-rate schedules, and a few
// steps of the whole recipe. Inputs come from a fixed seed.
//
//   torch_parity_probe DIR   writes DIR/meta.json (the cases, their settings and where each
//                            tensor lies) and DIR/data.bin (the tensors, float32, one after another)
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "core/rng.hpp"
#include "nn/model.hpp"
#include "optim/schedule.hpp"
#include "optim/sgd.hpp"

namespace hpc {
namespace {

// The two files: each tensor's bytes go to data.bin and its place and shape into the case's JSON.
class Dump {
 public:
  explicit Dump(const std::string& dir) : data_(dir + "/data.bin", std::ios::binary) {}
  // "name": {"offset": ..., "shape": [...]}
  std::string tensor(const std::string& name, const float* p, const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    data_.write(reinterpret_cast<const char*>(p), static_cast<std::streamsize>(n * sizeof(float)));
    std::ostringstream os;
    os << '"' << name << "\": {\"offset\": " << offset_ << ", \"shape\": [";
    for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
    os << "]}";
    offset_ += n;
    return os.str();
  }
  std::string tensor(const std::string& name, const Tensor& t) { return tensor(name, t.data<float>(), t.shape().dims()); }
  bool good() const { return data_.good(); }

 private:
  std::ofstream data_;
  int64_t offset_ = 0;  // in floats
};

std::string join(const std::vector<std::string>& parts) {
  std::string s;
  for (size_t i = 0; i < parts.size(); ++i) s += (i ? ",\n  " : "") + parts[i];
  return s;
}

Tensor normal_tensor(const Shape& shape, uint64_t which, double scale = 1.0) {
  Tensor t = Tensor::zeros<float>(shape);
  Philox rng(2024, RngStream::Test, which);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(rng.normal() * scale);
  return t;
}

const char* role_name(ParamRole r) {
  switch (r) {
    case ParamRole::Weight: return "weight";
    case ParamRole::Bias: return "bias";
    case ParamRole::NormScale: return "norm_scale";
    case ParamRole::NormShift: return "norm_shift";
  }
  return "?";
}

// The network's structure as JSON, for the test to build the same network in PyTorch.
class Structure final : public nn::LayerVisitor<float> {
 public:
  explicit Structure(const ParamStore<float>& store) : store_(store) {}
  std::string str() const { return os_.str(); }
  void visit(const nn::Conv2d<float>& l) override {
    const nn::ConvSpec& s = l.spec();
    os_ << "{\"kind\": \"conv\", \"kernel\": " << s.kernel << ", \"stride\": " << s.stride
        << ", \"padding\": " << s.padding << ", \"weight\": " << slot(l.weight_slot()) << ", \"bias\": " << slot(l.bias_slot()) << "}";
  }
  void visit(const nn::BatchNorm<float>& l) override {
    os_ << "{\"kind\": \"batchnorm\", \"relu\": " << (l.fused_relu() ? "true" : "false") << ", \"pool\": "
        << l.fused_pool().kernel << ", \"pool_stride\": " << l.fused_pool().stride << ", \"momentum\": " << l.momentum()
        << ", \"eps\": " << l.eps() << ", \"weight\": " << slot(l.gamma_slot()) << ", \"bias\": " << slot(l.beta_slot())
        << ", \"running_mean\": " << l.running_mean_slot() << ", \"running_var\": " << l.running_var_slot() << "}";
  }
  void visit(const nn::ReLU<float>&) override { os_ << "{\"kind\": \"relu\"}"; }
  void visit(const nn::MaxPool2d<float>& l) override {
    os_ << "{\"kind\": \"maxpool\", \"kernel\": " << l.kernel() << ", \"stride\": " << l.stride()
        << ", \"padding\": " << l.padding() << "}";
  }
  void visit(const nn::GlobalAvgPool<float>&) override { os_ << "{\"kind\": \"global_avg_pool\"}"; }
  void visit(const nn::Flatten<float>&) override { os_ << "{\"kind\": \"flatten\"}"; }
  void visit(const nn::Linear<float>& l) override {
    os_ << "{\"kind\": \"linear\", \"weight\": " << slot(l.weight_slot()) << ", \"bias\": " << slot(l.bias_slot()) << "}";
  }
  void visit(const nn::Sequential<float>& l) override {
    os_ << "{\"kind\": \"sequential\", \"layers\": [";
    for (size_t i = 0; i < l.layers().size(); ++i) {
      if (i) os_ << ", ";
      l.layers()[i]->accept(*this);
    }
    os_ << "]}";
  }
  void visit(const nn::Residual<float>& l) override {
    os_ << "{\"kind\": \"residual\", \"main\": ";
    visit(l.main());
    os_ << ", \"shortcut\": ";
    visit(l.shortcut());
    os_ << "}";
  }

 private:
  // A slot by its name ("null": none).
  std::string slot(int id) const { return id < 0 ? "null" : "\"" + store_.slots().at(id).name + "\""; }
  const ParamStore<float>& store_;
  std::ostringstream os_;
};

// Every parameter tensor (by name), every buffer (by index) of the store, with a prefix.
std::vector<std::string> store_tensors(Dump& d, const ParamStore<float>& s, const std::string& prefix, bool grads) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.slots().size(); ++i) {
    const ParamSlot& slot = s.slots()[i];
    const float* base = grads ? s.grads().data<float>() : s.values().data<float>();
    out.push_back(d.tensor(prefix + slot.name, base + slot.offset, slot.shape.dims()));
  }
  for (size_t i = 0; !grads && i < s.buffer_slots().size(); ++i) {
    const BufferSlot& b = s.buffer_slots()[i];
    out.push_back(d.tensor(prefix + "buffer." + std::to_string(i), s.buffers().data<float>() + b.offset, b.shape.dims()));
  }
  return out;
}

std::string roles(const ParamStore<float>& s) {
  std::string r = "{";
  for (size_t i = 0; i < s.slots().size(); ++i)
    r += (i ? ", \"" : "\"") + s.slots()[i].name + "\": \"" + role_name(s.slots()[i].role) + "\"";
  return r + "}";
}

std::vector<int32_t> labels_for(int64_t n, int64_t classes, uint64_t which) {
  Philox rng(2024, RngStream::Test, which);
  std::vector<int32_t> y(n);
  for (auto& v : y) v = static_cast<int32_t>(rng.below(static_cast<uint32_t>(classes)));
  return y;
}

std::string int_list(const std::vector<int32_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::string double_list(const std::vector<double>& v) {
  std::ostringstream os;
  os.precision(17);
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

// One model of the zoo: one training step's forward, loss and gradients from its initial state,
// an evaluation forward after that step (the running statistics), then `steps` steps of SGD
// under a one-cycle schedule, each on a batch of its own.
struct ModelCase {
  const char* name;
  nn::ModelKind kind;
  bool batch_norm, fuse;
  Shape input;
  int64_t batch;
};

std::string model_case(Dump& d, const ModelCase& c, int which) {
  nn::ModelSpec spec;
  spec.kind = c.kind;
  spec.batch_norm = c.batch_norm;
  spec.fuse = c.fuse;
  spec.input = c.input;
  spec.classes = 10;
  spec.label_smoothing = 0.1;
  nn::Model<float> m(spec);
  m.init(7 + which);
  const int steps = 3, classes = 10;
  optim::SgdSpec sgd_spec{0.9, true, 5e-2, true};  // a large decay, so that its effect shows in 3 steps
  optim::ScheduleSpec sched;
  sched.kind = optim::Schedule::OneCycle;
  sched.lr = 0.05;
  sched.total_samples = static_cast<double>(steps * c.batch);
  sched.samples_per_step = static_cast<double>(c.batch);
  sched.pct_start = 0.5;
  optim::LrSchedule schedule(sched);
  optim::Sgd<float> sgd(m.params(), sgd_spec);

  std::vector<std::string> t = store_tensors(d, m.params(), "initial.", false);
  std::vector<std::string> labels_json;
  for (int s = 0; s < steps; ++s) {
    const Tensor x = normal_tensor(nn::batch_shape(c.batch, c.input), 100 * which + s);
    const std::vector<int32_t> y = labels_for(c.batch, classes, 100 * which + s);
    t.push_back(d.tensor("x" + std::to_string(s), x));
    labels_json.push_back(int_list(y));
    const Tensor& logits = m.forward(x, true);
    if (s == 0) t.push_back(d.tensor("logits", logits));
    const double loss = m.loss(logits, y.data());
    if (s == 0) t.push_back(d.tensor("loss", std::vector<float>{static_cast<float>(loss)}.data(), {1}));
    m.backward();
    if (s == 0) {
      for (auto& g : store_tensors(d, m.params(), "grad.", true)) t.push_back(g);
      for (auto& b : store_tensors(d, m.params(), "after_step1.", false))
        if (b.find("buffer.") != std::string::npos) t.push_back(b);
      // Evaluation with the running statistics the first step left (before the update moves the
      // parameters: the test compares it with the initial parameters).
      t.push_back(d.tensor("eval_logits", m.forward(x, false)));
    }
    const double seen = static_cast<double>(s * c.batch);
    sgd.step(m.params(), schedule.lr(seen), schedule.momentum(seen, sgd_spec.momentum));
  }
  for (auto& v : store_tensors(d, m.params(), "final.", false)) t.push_back(v);
  Structure st(m.params());
  m.net().accept(st);
  std::ostringstream os;
  os << "{\"case\": \"model\", \"name\": \"" << c.name << "\", \"classes\": " << classes << ", \"batch\": " << c.batch
     << ", \"label_smoothing\": " << spec.label_smoothing << ", \"steps\": " << steps
     << ", \"sgd\": {\"momentum\": " << sgd_spec.momentum << ", \"nesterov\": true, \"weight_decay\": "
     << sgd_spec.weight_decay << "}, \"onecycle\": {\"max_lr\": " << sched.lr << ", \"pct_start\": " << sched.pct_start
     << ", \"div_factor\": " << sched.div_factor << ", \"final_div_factor\": " << sched.final_div_factor
     << ", \"base_momentum\": " << sched.base_momentum << ", \"max_momentum\": " << sched.max_momentum
     << "}, \"labels\": [" << join(labels_json) << "], \"roles\": " << roles(m.params())
     << ",\n \"net\": " << st.str() << ",\n \"tensors\": {" << join(t) << "}}";
  return os.str();
}

// The loss alone, on logits far from uniform, with and without smoothing.
std::string loss_case(Dump& d, double smoothing, int which) {
  const int64_t n = 6, k = 7;
  nn::SoftmaxCrossEntropy<float> loss(smoothing);
  const Tensor z = normal_tensor(Shape{n, k}, 9000 + which, 3.0);
  const std::vector<int32_t> y = labels_for(n, k, 9000 + which);
  const float l = static_cast<float>(loss.forward(z, y.data()));
  std::vector<std::string> t{d.tensor("logits", z), d.tensor("loss", &l, {1}), d.tensor("dlogits", loss.backward())};
  std::ostringstream os;
  os << "{\"case\": \"loss\", \"label_smoothing\": " << smoothing << ", \"labels\": " << int_list(y)
     << ", \"tensors\": {" << join(t) << "}}";
  return os.str();
}

// SGD alone: one tensor of each role, four steps with their own lr and momentum.
std::string sgd_case(Dump& d, const optim::SgdSpec& spec, int which) {
  ParamStore<float> store;
  store.add_param("w", Shape{3, 2}, ParamRole::Weight);
  store.add_param("b", Shape{3}, ParamRole::Bias);
  store.add_param("gamma", Shape{4}, ParamRole::NormScale);
  store.add_param("beta", Shape{4}, ParamRole::NormShift);
  store.allocate();
  for (size_t i = 0; i < store.slots().size(); ++i) {
    const Tensor v = normal_tensor(store.slots()[i].shape, 7000 + 10 * which + i);
    std::copy(v.data<float>(), v.data<float>() + v.numel(), store.value(static_cast<int>(i)));
  }
  std::vector<std::string> t = store_tensors(d, store, "initial.", false);
  optim::Sgd<float> sgd(store, spec);
  const std::vector<double> lrs{0.1, 0.3, 0.05, 0.2}, mus{0.9, 0.8, 0.95, 0.85};
  for (size_t s = 0; s < lrs.size(); ++s) {
    for (size_t i = 0; i < store.slots().size(); ++i) {
      const Tensor g = normal_tensor(store.slots()[i].shape, 8000 + 100 * which + 10 * s + i);
      std::copy(g.data<float>(), g.data<float>() + g.numel(), store.grad(static_cast<int>(i)));
    }
    for (auto& g : store_tensors(d, store, "grad" + std::to_string(s) + ".", true)) t.push_back(g);
    if (spec.momentum > 0) sgd.step(store, lrs[s], mus[s]);
    else sgd.step(store, lrs[s]);
  }
  for (auto& v : store_tensors(d, store, "final.", false)) t.push_back(v);
  std::ostringstream os;
  os << "{\"case\": \"sgd\", \"momentum\": " << (spec.momentum > 0 ? double_list(mus) : "[0, 0, 0, 0]")
     << ", \"nesterov\": " << (spec.nesterov ? "true" : "false") << ", \"weight_decay\": " << spec.weight_decay
     << ", \"decay_bias_and_norm\": " << (spec.decay_bias_and_norm ? "true" : "false") << ", \"lr\": "
     << double_list(lrs) << ", \"roles\": " << roles(store) << ", \"tensors\": {" << join(t) << "}}";
  return os.str();
}

// A schedule's lr and momentum before each of `steps` steps of `per_step` samples.
std::string schedule_case(const std::string& name, optim::ScheduleSpec spec, int64_t steps, double per_step,
                          const std::string& settings) {
  spec.total_samples = static_cast<double>(steps) * per_step;
  spec.samples_per_step = per_step;
  optim::LrSchedule s(spec);
  std::vector<double> lr, mu;
  for (int64_t k = 0; k < steps; ++k) {
    lr.push_back(s.lr(static_cast<double>(k) * per_step));
    mu.push_back(s.momentum(static_cast<double>(k) * per_step, 0.9));
  }
  std::ostringstream os;
  os.precision(17);
  os << "{\"case\": \"schedule\", \"name\": \"" << name << "\", \"lr0\": " << spec.lr << ", \"steps\": " << steps
     << ", \"settings\": " << settings << ", \"lr\": " << double_list(lr) << ", \"momentum\": " << double_list(mu)
     << "}";
  return os.str();
}

std::vector<std::string> schedule_cases() {
  using optim::Schedule;
  const int64_t steps = 23;  // over epochs of 5 steps: 4 whole epochs and 3 steps
  const double per_step = 64;
  std::vector<std::string> out;
  optim::ScheduleSpec s;
  s.lr = 0.4;
  s.kind = Schedule::Constant;
  out.push_back(schedule_case("constant", s, steps, per_step, "{}"));
  s.kind = Schedule::Step;
  s.step_samples = {2 * 5 * per_step, 4 * 5 * per_step};  // --lr-step-epochs 2,4
  s.gamma = 0.2;
  out.push_back(schedule_case("step", s, steps, per_step, "{\"milestones\": [10, 20], \"gamma\": 0.2}"));
  s.kind = Schedule::Cosine;
  s.min_lr = 0.01;
  out.push_back(schedule_case("cosine", s, steps, per_step, "{\"eta_min\": 0.01}"));
  s.warmup_samples = 1.5 * 5 * per_step;  // --warmup-epochs 1.5
  out.push_back(schedule_case("cosine_warmup", s, steps, per_step, "{\"eta_min\": 0.01, \"warmup_steps\": 7.5}"));
  s.warmup_samples = 0;
  s.kind = Schedule::OneCycle;
  out.push_back(schedule_case("onecycle", s, steps, per_step, "{}"));
  s.pct_start = 0.25, s.div_factor = 10, s.final_div_factor = 100, s.base_momentum = 0.8, s.max_momentum = 0.97;
  out.push_back(schedule_case("onecycle_custom", s, steps, per_step,
                              "{\"pct_start\": 0.25, \"div_factor\": 10, \"final_div_factor\": 100, "
                              "\"base_momentum\": 0.8, \"max_momentum\": 0.97}"));
  s.cycle_momentum = false;
  out.push_back(schedule_case("onecycle_fixed_momentum", s, steps, per_step,
                              "{\"pct_start\": 0.25, \"div_factor\": 10, \"final_div_factor\": 100, "
                              "\"cycle_momentum\": false}"));
  return out;
}

int run(const std::string& dir) {
  Dump d(dir);
  std::vector<std::string> cases;
  const ModelCase models[] = {
      {"cnn", nn::ModelKind::Cnn, true, true, Shape{12, 12, 1}, 4},
      {"cnn_unfused", nn::ModelKind::Cnn, true, false, Shape{12, 12, 1}, 4},
      {"cnn_no_bn", nn::ModelKind::Cnn, false, true, Shape{10, 10, 2}, 3},
      {"mlp", nn::ModelKind::Mlp, true, true, Shape{6, 6, 1}, 5},
      {"resnet20", nn::ModelKind::ResNet20, true, true, Shape{8, 8, 3}, 3},
      {"resnet20_no_bn", nn::ModelKind::ResNet20, false, true, Shape{6, 6, 3}, 2},
      // Above 64 pixels a side: the ImageNet stem (7x7/2 conv, 3x3/2 max pool padded by 1).
      {"resnet18_imagenet_stem", nn::ModelKind::ResNet18, true, true, Shape{72, 72, 3}, 2},
  };
  int which = 0;
  for (const ModelCase& c : models) cases.push_back(model_case(d, c, ++which));
  for (double s : {0.0, 0.1, 0.3}) cases.push_back(loss_case(d, s, ++which));
  for (bool nesterov : {true, false})
    for (bool all : {true, false}) cases.push_back(sgd_case(d, optim::SgdSpec{0.9, nesterov, 0.03, all}, ++which));
  cases.push_back(sgd_case(d, optim::SgdSpec{0.0, false, 0.03, true}, ++which));
  for (auto& s : schedule_cases()) cases.push_back(s);
  std::ofstream meta(dir + "/meta.json");
  meta << "[" << join(cases) << "]\n";
  if (!meta.good() || !d.good()) {
    std::cerr << "torch_parity_probe: cannot write into " << dir << "\n";
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace hpc

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: torch_parity_probe DIR\n";
    return 2;
  }
  return hpc::run(argv[1]);
}

#include "export/onnx_export.hpp"

#include <onnx/checker.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

#include <cmath>
#include <optional>

#include "core/error.hpp"

namespace hpc::onnx_export {
namespace {

using Floats = std::vector<float>;
using Dims = std::vector<int64_t>;

// Writes the nodes and initializers of one graph, layer by layer, in forward order.
class GraphWriter {
 public:
  GraphWriter(onnx::GraphProto& graph, const ParamStore<float>& store, bool fold)
      : g_(graph), store_(store), fold_(fold) {}

  // x * scale + shift per channel: training's (x / 255 - mean) / std.
  std::string normalise(const std::string& x, const data::Normalization& norm) {
    const auto c = static_cast<int64_t>(norm.mean.size());
    Floats scale(static_cast<size_t>(c)), shift(static_cast<size_t>(c));
    for (size_t j = 0; j < scale.size(); ++j) {
      scale[j] = static_cast<float>(1.0 / (255.0 * norm.std[j]));
      shift[j] = static_cast<float>(-static_cast<double>(norm.mean[j]) / norm.std[j]);
    }
    // C x 1 x 1, broadcast over N x C x H x W: OpenCV 4.6 refuses an Add of a 1 x C x 1 x 1 constant.
    const std::string scaled = node("Mul", {x, constant("normalize.scale", {c, 1, 1}, scale)});
    return node("Add", {scaled, constant("normalize.shift", {c, 1, 1}, shift)});
  }

  // The layers of s from x (a per-sample shape s.shapes()[0]); returns the last output's name.
  std::string sequential(const nn::Sequential<float>& s, std::string x) {
    const auto& layers = s.layers();
    for (size_t i = 0; i < layers.size(); ++i) {
      const auto* norm =
          i + 1 < layers.size() ? dynamic_cast<const nn::BatchNorm<float>*>(layers[i + 1].get()) : nullptr;
      const bool folds = fold_ && norm && (is<nn::Conv2d<float>>(*layers[i]) || is<nn::Linear<float>>(*layers[i]));
      x = layer(*layers[i], s.shapes()[i], folds ? norm : nullptr, x);
      if (folds) x = after_norm(*norm, x), ++i;  // the batch norm is inside the layer now
    }
    return x;
  }

  // Names the last node's output as the graph's output.
  void name_output(const std::string& x, const std::string& name) {
    for (auto& out : *g_.mutable_node(g_.node_size() - 1)->mutable_output())
      if (out == x) out = name;
  }

 private:
  template <class L>
  static bool is(const nn::Layer<float>& l) {
    return dynamic_cast<const L*>(&l) != nullptr;
  }

  // The nodes of one layer from x (its input, of per-sample shape in; folded: the batch norm
  // after it, folded into its weights); returns its output's name. A visitor of every kind of
  // layer (nn/layer.hpp): a kind without its ONNX form leaves it abstract, and the build fails.
  std::string layer(const nn::Layer<float>& l, const Shape& in, const nn::BatchNorm<float>* folded,
                    const std::string& x) {
    class Nodes final : public nn::LayerVisitor<float> {
     public:
      Nodes(GraphWriter& w, const Shape& in, const nn::BatchNorm<float>* folded, const std::string& x)
          : w_(w), in_(in), folded_(folded), x_(x) {}
      void visit(const nn::Conv2d<float>& c) override { y = w_.conv(c, folded_, x_); }
      void visit(const nn::Linear<float>& f) override { y = w_.linear(f, folded_, x_); }
      void visit(const nn::BatchNorm<float>& b) override { y = w_.after_norm(b, w_.batch_norm(b, x_)); }
      void visit(const nn::ReLU<float>&) override { y = w_.node("Relu", {x_}); }
      void visit(const nn::MaxPool2d<float>& p) override {
        y = w_.max_pool(p.kernel(), p.stride(), p.padding(), x_);
      }
      void visit(const nn::GlobalAvgPool<float>&) override { y = w_.flatten(w_.node("GlobalAveragePool", {x_})); }
      void visit(const nn::Flatten<float>&) override { y = w_.flatten_from(in_, x_); }
      void visit(const nn::Residual<float>& r) override { y = w_.residual(r, x_); }
      void visit(const nn::Sequential<float>& s) override { y = w_.sequential(s, x_); }
      std::string y;

     private:
      GraphWriter& w_;
      const Shape& in_;
      const nn::BatchNorm<float>* folded_;
      const std::string& x_;
    } nodes(*this, in, folded, x);
    l.accept(nodes);
    return nodes.y;
  }

  std::string residual(const nn::Residual<float>& r, const std::string& x) {
    const std::string main = sequential(r.main(), x);
    const std::string shortcut = r.shortcut().empty() ? x : sequential(r.shortcut(), x);
    return node("Relu", {node("Add", {main, shortcut})});
  }

  // hpctrain flattens H x W x C (NHWC); ONNX's Flatten of NCHW gives C x H x W. The next linear
  // layer takes its columns in that order (hwc_).
  std::string flatten_from(const Shape& in, const std::string& x) {
    if (in.rank() == 1) return x;
    HPC_CHECK(in.rank() == 3, "flatten of ", in.str());
    hwc_ = in;
    return flatten(x);
  }

  std::string flatten(const std::string& x) {
    const std::string y = node("Flatten", {x});
    attr_int("axis", 1);
    return y;
  }

  std::string conv(const nn::Conv2d<float>& c, const nn::BatchNorm<float>* folded, const std::string& x) {
    const nn::ConvSpec& spec = c.spec();
    const Shape& ws = store_.slots()[static_cast<size_t>(c.weight_slot())].shape;  // O x KH x KW x I
    const int64_t o = ws[0], k = ws[1], in = ws[3];
    Floats w(static_cast<size_t>(ws.numel()));
    const float* src = store_.value(c.weight_slot());
    for (int64_t a = 0; a < o; ++a)
      for (int64_t i = 0; i < in; ++i)
        for (int64_t kh = 0; kh < k; ++kh)
          for (int64_t kw = 0; kw < k; ++kw)
            w[static_cast<size_t>(((a * in + i) * k + kh) * k + kw)] = src[((a * k + kh) * k + kw) * in + i];
    std::optional<Floats> b = bias(c.bias_slot(), o);
    if (folded) fold(*folded, w, b, o);
    const std::string name = slot_name(c.weight_slot());
    std::vector<std::string> inputs{x, constant(name, {o, in, k, k}, w)};
    if (b) inputs.push_back(constant(bias_name(name), {o}, *b));
    const std::string y = node("Conv", inputs);
    attr_ints("kernel_shape", {k, k});
    attr_ints("strides", {spec.stride, spec.stride});
    attr_ints("pads", {spec.padding, spec.padding, spec.padding, spec.padding});
    attr_ints("dilations", {1, 1});
    attr_int("group", 1);
    return y;
  }

  std::string linear(const nn::Linear<float>& f, const nn::BatchNorm<float>* folded, const std::string& x) {
    const Shape& ws = store_.slots()[static_cast<size_t>(f.weight_slot())].shape;  // O x I
    const int64_t o = ws[0], in = ws[1];
    const float* src = store_.value(f.weight_slot());
    Floats w(src, src + ws.numel());
    if (hwc_) {  // columns from H x W x C order to C x H x W
      const int64_t h = (*hwc_)[0], wd = (*hwc_)[1], c = (*hwc_)[2];
      HPC_CHECK(h * wd * c == in, "linear of ", in, " after a flatten of ", hwc_->str());
      for (int64_t a = 0; a < o; ++a)
        for (int64_t p = 0; p < h * wd; ++p)
          for (int64_t ch = 0; ch < c; ++ch)
            w[static_cast<size_t>(a * in + ch * h * wd + p)] = src[a * in + p * c + ch];
      hwc_.reset();
    }
    // Gemm's C is optional, but not to every importer: a linear layer without bias gets zeros.
    Floats b = bias(f.bias_slot(), o).value_or(Floats(static_cast<size_t>(o), 0.0f));
    std::optional<Floats> ob = std::move(b);
    if (folded) fold(*folded, w, ob, o);
    const std::string name = slot_name(f.weight_slot());
    const std::string y = node("Gemm", {x, constant(name, {o, in}, w), constant(bias_name(name), {o}, *ob)});
    attr_float("alpha", 1.0f);
    attr_float("beta", 1.0f);
    attr_int("transA", 0);
    attr_int("transB", 1);
    return y;
  }

  // Batch norm folded into the layer before it, in double: w' = w * s, b' = beta + (b - mean) * s
  // with s = gamma / sqrt(running_var + eps) per output channel (rows of w).
  void fold(const nn::BatchNorm<float>& bn, Floats& w, std::optional<Floats>& b, int64_t outputs) {
    const float* gamma = store_.value(bn.gamma_slot());
    const float* beta = store_.value(bn.beta_slot());
    const float* mean = store_.buffer(bn.running_mean_slot());
    const float* var = store_.buffer(bn.running_var_slot());
    const int64_t per_row = static_cast<int64_t>(w.size()) / outputs;
    Floats folded_bias(static_cast<size_t>(outputs));
    for (int64_t a = 0; a < outputs; ++a) {
      const double s = static_cast<double>(gamma[a]) / std::sqrt(static_cast<double>(var[a]) + bn.eps());
      for (int64_t j = 0; j < per_row; ++j) {
        float& v = w[static_cast<size_t>(a * per_row + j)];
        v = static_cast<float>(v * s);
      }
      const double old = b ? (*b)[static_cast<size_t>(a)] : 0.0;
      folded_bias[static_cast<size_t>(a)] = static_cast<float>(beta[a] + (old - mean[a]) * s);
    }
    b = std::move(folded_bias);
  }

  std::string batch_norm(const nn::BatchNorm<float>& bn, const std::string& x) {
    const Shape& gs = store_.slots()[static_cast<size_t>(bn.gamma_slot())].shape;
    const int64_t c = gs[0];
    auto values = [c](const float* p) { return Floats(p, p + c); };
    const std::string name = slot_name(bn.gamma_slot());
    const std::string base = name.substr(0, name.rfind('.'));
    const std::string y = node("BatchNormalization",
                               {x, constant(name, {c}, values(store_.value(bn.gamma_slot()))),
                                constant(slot_name(bn.beta_slot()), {c}, values(store_.value(bn.beta_slot()))),
                                constant(base + ".running_mean", {c}, values(store_.buffer(bn.running_mean_slot()))),
                                constant(base + ".running_var", {c}, values(store_.buffer(bn.running_var_slot())))});
    attr_float("epsilon", static_cast<float>(bn.eps()));
    attr_float("momentum", static_cast<float>(1 - bn.momentum()));  // ONNX's is the running statistics' weight
    return y;
  }

  // What hpctrain fuses into a batch norm: its ReLU, then its max pool.
  std::string after_norm(const nn::BatchNorm<float>& bn, std::string x) {
    if (bn.fused_relu()) x = node("Relu", {x});
    if (bn.fused_pool().kernel > 0) x = max_pool(bn.fused_pool().kernel, bn.fused_pool().stride, 0, x);
    return x;
  }

  // ONNX's MaxPool, like hpctrain's, never picks a padding cell.
  std::string max_pool(int64_t kernel, int64_t stride, int64_t pad, const std::string& x) {
    const std::string y = node("MaxPool", {x});
    attr_ints("kernel_shape", {kernel, kernel});
    attr_ints("strides", {stride, stride});
    attr_ints("pads", {pad, pad, pad, pad});
    attr_int("ceil_mode", 0);  // floor, as hpctrain (and PyTorch) drop windows that do not fit
    return y;
  }

  std::optional<Floats> bias(int slot, int64_t n) const {
    if (slot < 0) return std::nullopt;
    const float* p = store_.value(slot);
    return Floats(p, p + n);
  }

  std::string slot_name(int slot) const { return "param." + store_.slots()[static_cast<size_t>(slot)].name; }
  static std::string bias_name(const std::string& weight) { return weight.substr(0, weight.rfind('.')) + ".bias"; }

  std::string constant(const std::string& name, const Dims& dims, const Floats& values) {
    onnx::TensorProto* t = g_.add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    for (int64_t d : dims) t->add_dims(d);
    // raw_data is little-endian float32, as hpctrain's own (x86-64, AArch64).
    t->set_raw_data(values.data(), values.size() * sizeof(float));
    return name;
  }

  // A node of `op` with one output (named after the node); attributes follow with attr_*.
  std::string node(const std::string& op, const std::vector<std::string>& inputs) {
    onnx::NodeProto* n = g_.add_node();
    const std::string name = op + "_" + std::to_string(++nodes_);
    n->set_name(name);
    n->set_op_type(op);
    for (const std::string& in : inputs) n->add_input(in);
    n->add_output(name);
    last_ = n;
    return name;
  }

  onnx::AttributeProto* attr(const std::string& name, onnx::AttributeProto::AttributeType type) {
    onnx::AttributeProto* a = last_->add_attribute();
    a->set_name(name);
    a->set_type(type);
    return a;
  }
  void attr_int(const std::string& name, int64_t v) { attr(name, onnx::AttributeProto::INT)->set_i(v); }
  void attr_float(const std::string& name, float v) { attr(name, onnx::AttributeProto::FLOAT)->set_f(v); }
  void attr_ints(const std::string& name, const Dims& v) {
    onnx::AttributeProto* a = attr(name, onnx::AttributeProto::INTS);
    for (int64_t x : v) a->add_ints(x);
  }

  onnx::GraphProto& g_;
  const ParamStore<float>& store_;
  bool fold_;
  std::optional<Shape> hwc_;  // a flatten's H x W x C input, until the linear layer after it
  onnx::NodeProto* last_ = nullptr;
  int nodes_ = 0;
};

// A float32 tensor of N (dynamic, "batch") x dims.
void declare(onnx::ValueInfoProto* v, const std::string& name, const Dims& dims) {
  v->set_name(name);
  onnx::TypeProto_Tensor* t = v->mutable_type()->mutable_tensor_type();
  t->set_elem_type(onnx::TensorProto::FLOAT);
  onnx::TensorShapeProto* s = t->mutable_shape();
  s->add_dim()->set_dim_param("batch");
  for (int64_t d : dims) s->add_dim()->set_dim_value(d);
}

// libonnx's checker and strict shape inference, which must find N x classes at the output.
void self_check(const onnx::ModelProto& model, int64_t classes) {
  onnx::ModelProto inferred = model;
  try {
    onnx::checker::check_model(model);
    onnx::shape_inference::InferShapes(inferred, onnx::OpSchemaRegistry::Instance(),
                                       onnx::ShapeInferenceOptions(true, 1, false));
  } catch (const std::exception& e) {
    HPC_CHECK(false, "the exported ONNX graph fails libonnx's checks: ", e.what());
  }
  const auto& shape = inferred.graph().output(0).type().tensor_type().shape();
  HPC_CHECK(shape.dim_size() == 2 && shape.dim(1).dim_value() == classes, "the exported graph's output is not N x ",
            classes);
}

}  // namespace

std::vector<char> export_onnx(const nn::Model<float>& model, const ExportSpec& spec) {
  const nn::ModelSpec& m = model.spec();
  const int64_t h = m.input[0], w = m.input[1], c = m.input[2];
  HPC_CHECK(static_cast<int64_t>(spec.norm.mean.size()) == c && spec.norm.std.size() == spec.norm.mean.size(),
            "a normalisation of ", spec.norm.mean.size(), " channels for a model of ", c);
  onnx::ModelProto proto;
  proto.set_ir_version(7);  // the IR version of opset 13 (ONNX 1.8), for runtimes of that age
  onnx::OperatorSetIdProto* opset = proto.add_opset_import();
  opset->set_domain("");
  opset->set_version(kOpset);
  proto.set_producer_name("hpctrain");
  proto.set_producer_version(HPCTRAIN_VERSION);
  proto.set_model_version(spec.model_version);
  proto.set_doc_string(spec.doc);
  for (const auto& [key, value] : spec.metadata) {
    onnx::StringStringEntryProto* e = proto.add_metadata_props();
    e->set_key(key);
    e->set_value(value);
  }
  onnx::GraphProto& graph = *proto.mutable_graph();
  graph.set_name(nn::model_name(m.kind));
  declare(graph.add_input(), kInputName, {c, h, w});
  GraphWriter writer(graph, model.params(), spec.fold_batch_norm);
  const std::string logits = writer.sequential(model.net(), writer.normalise(kInputName, spec.norm));
  writer.name_output(logits, kOutputName);
  declare(graph.add_output(), kOutputName, {m.classes});
  self_check(proto, m.classes);
  std::string bytes;
  HPC_CHECK(proto.SerializeToString(&bytes), "protobuf cannot serialise the ONNX model");
  return {bytes.begin(), bytes.end()};
}

}  // namespace hpc::onnx_export

// Per-layer time of one training step (forward and backward of every top-level layer, the
// loss and the optimizer) on random data: where the step's time goes. The minimum over
// the repetitions is reported as well as the median, since the minimum is what survives a
// noisy shared machine.
//   layer_profile [--model cnn] [--batch 64] [--threads 1] [--steps 50] [--input 28,28,1]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cli.hpp"
#include "core/rng.hpp"
#include "nn/gemm.hpp"
#include "nn/model.hpp"
#include "optim/sgd.hpp"

using namespace hpc;
using Clock = std::chrono::steady_clock;

namespace {
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

struct Stat {
  std::vector<double> v;
  double min() const { return *std::min_element(v.begin(), v.end()); }
  double median() const {
    auto c = v;
    std::nth_element(c.begin(), c.begin() + c.size() / 2, c.end());
    return c[c.size() / 2];
  }
};
}  // namespace

int main(int argc, char** argv) {
  std::string model_name = "cnn", input = "28,28,1";
  int64_t batch = 64, steps = 50, h = 28, w = 28, ch = 1;
  int threads = 1;
  bench::po::options_description desc(
      "Usage: layer_profile [options]\nPer-layer time of one training step on random data, on the CPU");
  desc.add_options()("model", bench::po::value(&model_name)->default_value(model_name), "the model (hpctrain --model)")(
      "batch", bench::po::value(&batch)->default_value(batch), "samples a step")(
      "threads", bench::po::value(&threads)->default_value(threads), "math-library threads")(
      "steps", bench::po::value(&steps)->default_value(steps), "timed steps (after 3 of warm-up)")(
      "input", bench::po::value(&input)->default_value(input), "H,W,C of one sample");
  const auto done = bench::read_command_line("layer_profile", argc, argv, desc, [&] {
    char rest = 0;
    bench::require(std::sscanf(input.c_str(), "%ld,%ld,%ld%c", &h, &w, &ch, &rest) == 3 && h > 0 && w > 0 && ch > 0,
                   "--input must be H,W,C, three positive whole numbers, got '" + input + "'");
    bench::require(batch > 0 && batch <= 65536, "--batch must be 1 to 65536");
    bench::require(steps > 0 && steps <= 1000000, "--steps must be 1 to 1000000");
    bench::require(threads > 0 && threads <= 4096, "--threads must be 1 to 4096");
  });
  if (done) return *done;
  return bench::run_main("layer_profile", [&] {
    nn::set_math_threads(threads);
    nn::ModelSpec spec;
    spec.kind = parse_named(nn::kModelNames, model_name, "model");
    spec.input = Shape{h, w, ch};
    nn::Model<float> model(spec);
    model.init(1);
    optim::Sgd<float> sgd(model.params(), {});
    Tensor x = Tensor::zeros<float>(Shape{batch, h, w, ch});
    std::vector<int32_t> labels(batch);
    Philox rng(7, RngStream::Test);
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(rng.normal());
    for (auto& l : labels) l = static_cast<int32_t>(rng.below(10));

    auto& layers = model.net().layers();
    const size_t n = layers.size();
    std::vector<Stat> fwd(n), bwd(n);
    Stat loss_t, opt_t, total;
    for (int64_t s = 0; s < steps + 3; ++s) {
      const bool record = s >= 3;  // warm-up: buffers grow, JIT kernels are generated
      const auto t_step = Clock::now();
      std::vector<const Tensor*> acts{&x};
      for (size_t i = 0; i < n; ++i) {
        auto t = Clock::now();
        acts.push_back(&layers[i]->forward(*acts.back(), true));
        if (record) fwd[i].v.push_back(ms_since(t));
      }
      auto t = Clock::now();
      nn::SoftmaxCrossEntropy<float> ce;  // the loss and its gradient, outside Model to time layers one by one
      ce.forward(*acts.back(), labels.data());
      const Tensor* g = &ce.backward();
      if (record) loss_t.v.push_back(ms_since(t));
      for (size_t i = n; i-- > 0;) {
        t = Clock::now();
        g = &layers[i]->backward(*g, i > 0);
        if (record) bwd[i].v.push_back(ms_since(t));
      }
      t = Clock::now();
      sgd.step(model.params(), 0.01);
      if (record) {
        opt_t.v.push_back(ms_since(t));
        total.v.push_back(ms_since(t_step));
      }
    }
    std::printf("%-4s %-16s %10s %10s %10s %10s\n", "#", "layer", "fwd min", "fwd med", "bwd min", "bwd med");
    for (size_t i = 0; i < n; ++i)
      std::printf("%-4zu %-16s %10.3f %10.3f %10.3f %10.3f\n", i, layers[i]->kind().c_str(), fwd[i].min(),
                  fwd[i].median(), bwd[i].min(), bwd[i].median());
    std::printf("%-21s %10.3f %10.3f\n", "loss", loss_t.min(), loss_t.median());
    std::printf("%-21s %10.3f %10.3f\n", "optimizer", opt_t.min(), opt_t.median());
    const double flops = model.train_flops_per_sample() * static_cast<double>(batch);
    std::printf("step: min %.3f ms, median %.3f ms -> %.0f img/s (min), %.1f GFLOP/s; GEMM %s, %d thread(s)\n",
                total.min(), total.median(), batch / total.min() * 1e3, flops / total.min() / 1e6,
                nn::gemm_backend(), threads);
    return 0;
  });
}

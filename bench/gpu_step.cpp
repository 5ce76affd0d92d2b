// hpctrain's training step on one GPU with the batch already there, timed as the PyTorch peer
// times its own (bench/torch_gpu_steps.py): --warmup steps (cuDNN's algorithm choice, the
// allocator's first requests), then --iters steps between two CUDA events. One step is what
// the GPU engine enqueues (train/engine/gpu_engine.cpp): forward, loss, backward, the SGD update; the
// trainer also reads each step's loss back and stages each batch from the host, which this
// leaves out on purpose (bench/gpu_vs_peer.sh times the whole trainer separately).
// Prints one JSON line: images/s, ms per step, the model's training FLOPs per sample.
//   gpu_step [--model cnn] [--batch 128] [--image-size 28] [--channels 1] [--classes 10]
//            [--precision tf32] [--warmup 15] [--iters 50] [--no-deterministic] [--cuda-graphs]
//            [--bn-tuning 8,4,2,1,1024[,FUSED]]
// --cuda-graphs captures one step after the warm-up as a CUDA graph and times its replays, as
// the trainer's --cuda-graphs does: the GPU's time for the step without the host's launches.
// --copy-bandwidth instead measures the GPU's copy bandwidth, the roofline the kernels step of
// bench/gpu_vs_peer.sh holds every kernel against: a device-to-device copy of 2 GiB between two
// CUDA events, read plus written bytes over the time, the best of 10 after one untimed copy
// (JSON: copy_bytes_per_s).
// --kernel-shapes instead times our batch-norm passes (kernels/batch_norm.cu: forward with its
// ReLU, backward with the ReLU's mask; bf16) on the shapes of ResNet-50's batch norms at --batch,
// and the ReLU backward (one 16-byte pack a thread, no set-up) beside them: per shape one JSON
// line with the time (median of 20 launches), the bytes the passes must move and their rate,
// for each of the passes' launch choices (kernels::batch_norm_tunings), then per choice the
// time of ResNet-50's 53 batch norms, fastest first: what the default is chosen by.
// --bn-tuning P,B,R,W[,S[,F]] runs the step with one of those choices (F = 1: the fused finalize).
#include <cuda_runtime_api.h>

#include <boost/program_options.hpp>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/choice.hpp"
#include "core/device.hpp"
#include "core/error.hpp"
#include "core/option_kit.hpp"
#include "kernels/kernels.hpp"
#include "nn/cuda/network.hpp"
#include "nn/model.hpp"
#include "optim/sgd.hpp"
#include "optim/sgd_cuda.hpp"

using namespace hpc;
namespace po = boost::program_options;

namespace {

struct Args {
  std::string model = "cnn", precision = "tf32";
  int64_t batch = 128, image_size = 28, channels = 1, classes = 10, warmup = 15, iters = 50;
  bool deterministic = true, copy_bandwidth = false, graphs = false, kernel_shapes = false;
  std::optional<kernels::BatchNormTuning> bn_tuning;  // --bn-tuning; none: the kernels' default
};

Args parse(int argc, char** argv) {
  Args a;
  po::options_description d("gpu_step options");
  d.add_options()("help", "this help")("model", po::value(&a.model), "cnn, mlp, resnet20, resnet18, resnet50")(
      "batch", po::value(&a.batch), "samples per step")("image-size", po::value(&a.image_size), "image side")(
      "channels", po::value(&a.channels), "image channels")("classes", po::value(&a.classes), "classes")(
      "precision", po::value(&a.precision), "fp32, tf32 or bf16 (as the peer's autocast)")(
      "warmup", po::value(&a.warmup), "untimed steps first")("iters", po::value(&a.iters), "timed steps")(
      "no-deterministic", po::bool_switch(), "let cuDNN choose non-deterministic algorithms")(
      "copy-bandwidth", po::bool_switch(&a.copy_bandwidth), "measure the device-to-device copy bandwidth instead")(
      "cuda-graphs", po::bool_switch(&a.graphs), "time replays of the step captured as a CUDA graph")(
      "kernel-shapes", po::bool_switch(&a.kernel_shapes), "time the batch-norm passes on ResNet-50's shapes instead")(
      "bn-tuning", po::value<std::string>(),
      "the batch-norm passes' launch: PACK_BYTES,BLOCKS_PER_SM,ROWS,ONE_WAVE[,SUM_BLOCKS[,FUSED]]");
  po::variables_map vm;
  const po::positional_options_description none;  // a word that is no option's value is refused
  try {
    po::store(po::command_line_parser(argc, argv).options(d).positional(none).run(), vm);
  } catch (const po::error& e) {
    throw po::error(options::error_text(e, argc, argv, d, none));
  }
  po::notify(vm);
  if (vm.count("help")) {
    std::cout << d;
    std::exit(0);
  }
  a.deterministic = !vm["no-deterministic"].as<bool>();
  // A bad one is named before any GPU work.
  if (vm.count("bn-tuning")) a.bn_tuning = kernels::parse_batch_norm_tuning(vm["bn-tuning"].as<std::string>());
  if (a.batch < 1 || a.iters < 1 || a.warmup < 0 || a.image_size < 1 || a.channels < 1 || a.classes < 2)
    throw Error(ErrorKind::Usage, "--batch, --iters, --image-size, --channels and --classes must be positive");
  return a;
}

nn::cuda::Math math_of(const std::string& p) {
  if (p == "fp32") return nn::cuda::Math::Fp32;
  if (p == "tf32") return nn::cuda::Math::Tf32;
  if (p == "bf16") return nn::cuda::Math::Bf16;
  throw Error(ErrorKind::Usage, "--precision must be fp32, tf32 or bf16, got '" + p + "'");
}

// Device tensor of n floats from a fixed seed.
Tensor device_normal(Shape shape, unsigned seed) {
  Tensor host = Tensor::zeros<float>(shape);
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0, 1);
  for (int64_t i = 0; i < host.numel(); ++i) host.data<float>()[i] = d(g);
  Tensor dev(shape, DType::F32, DeviceKind::CUDA);
  device::copy(dev.raw(), host.raw(), host.bytes(), device::Copy::HostToDevice);
  return dev;
}

// The best of several timed device-to-device copies, counting the bytes read and the bytes
// written (as a kernel's DRAM traffic is counted: ncu's dram__bytes_read + dram__bytes_write).
int copy_bandwidth() {
  constexpr size_t kBytes = size_t{2} << 30;
  constexpr int kTimed = 10;
  void *src = nullptr, *dst = nullptr;
  CUDA_CHECK(cudaMalloc(&src, kBytes));
  CUDA_CHECK(cudaMalloc(&dst, kBytes));
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CUDA_CHECK(cudaMemsetAsync(src, 1, kBytes, stream));  // every page touched before the clock runs
  CUDA_CHECK(cudaMemcpyAsync(dst, src, kBytes, cudaMemcpyDeviceToDevice, stream));
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  float best_ms = 0;
  for (int i = 0; i < kTimed; ++i) {
    CUDA_CHECK(cudaEventRecord(start, stream));
    CUDA_CHECK(cudaMemcpyAsync(dst, src, kBytes, cudaMemcpyDeviceToDevice, stream));
    CUDA_CHECK(cudaEventRecord(stop, stream));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (i == 0 || ms < best_ms) best_ms = ms;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
  cudaFree(src);
  cudaFree(dst);
  HPC_CHECK(best_ms > 0, "a copy of ", kBytes, " bytes timed at ", best_ms, " ms");
  const double moved = 2.0 * static_cast<double>(kBytes);
  std::printf("{\"workload\": \"copy\", \"copy_bytes\": %zu, \"copies\": %d, \"best_ms\": %.4f, "
              "\"copy_bytes_per_s\": %.0f}\n",
              kBytes, kTimed, best_ms, moved / (best_ms * 1e-3));
  return 0;
}

// The median time in ms of `launches` runs of f on `stream`, each between two events.
template <class F>
double median_ms(cudaStream_t stream, int launches, F&& f) {
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  f();  // untimed: first-launch costs
  std::vector<float> ms(static_cast<size_t>(launches));
  for (float& m : ms) {
    CUDA_CHECK(cudaEventRecord(start, stream));
    f();
    CUDA_CHECK(cudaEventRecord(stop, stream));
    CUDA_CHECK(cudaEventSynchronize(stop));
    CUDA_CHECK(cudaEventElapsedTime(&m, start, stop));
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int kernel_shapes(int64_t batch) {
  struct Shape2 {
    int64_t side, channels, count;  // a batch norm's input: batch x side x side x channels; how many ResNet-50 has
  };
  // ResNet-50's batch norms by (side, channels), bottleneck widths 64 to 512 (x4 at the joins),
  // and how many of each it has (53 in all: stages of 3, 4, 6 and 3 blocks, stride in the 3x3).
  const Shape2 shapes[] = {{112, 64, 1}, {56, 64, 6},  {56, 256, 4}, {56, 128, 1}, {28, 128, 7}, {28, 512, 5},
                           {28, 256, 1}, {14, 256, 11}, {14, 1024, 7}, {14, 512, 1}, {7, 512, 5}, {7, 2048, 4}};
  const int64_t most = batch * 112 * 112 * 64;
  const DType t = DType::BF16;
  void *x = nullptr, *y = nullptr, *dy = nullptr, *dx = nullptr, *work = nullptr;
  for (void** p : {&x, &y, &dy, &dx}) {
    CUDA_CHECK(cudaMalloc(p, static_cast<size_t>(most) * 2));
    CUDA_CHECK(cudaMemset(*p, 0x3c, static_cast<size_t>(most) * 2));  // bf16 0x3c3c: about 0.0115
  }
  size_t work_bytes = 0;
  for (const Shape2& s : shapes)
    work_bytes = std::max(work_bytes, kernels::batch_norm_work_bytes(t, batch * s.side * s.side, s.channels));
  CUDA_CHECK(cudaMalloc(&work, work_bytes));
  float* vec = nullptr;  // gamma, beta, running mean and variance, saved mean and 1/std, dgamma, dbeta
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&vec), 8 * 2048 * sizeof(float)));
  CUDA_CHECK(cudaMemset(vec, 0, 8 * 2048 * sizeof(float)));
  float* v[8];
  for (int i = 0; i < 8; ++i) v[i] = vec + i * 2048;
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // The ReLU backward on each shape, once: it has no launch choices.
  std::vector<double> relu;
  double relu_total = 0;
  for (const Shape2& s : shapes) {
    const int64_t n = batch * s.side * s.side * s.channels;
    relu.push_back(median_ms(stream, 20, [&] { kernels::relu_backward(t, y, dy, dx, n, stream); }));
    relu_total += static_cast<double>(s.count) * relu.back();
  }
  const kernels::BatchNormTuning chosen = kernels::batch_norm_tuning();
  struct Total {
    std::string tuning;
    double ms;
  };
  std::vector<Total> totals;
  for (const kernels::BatchNormTuning& tuning : kernels::batch_norm_tunings()) {
    kernels::set_batch_norm_tuning(tuning);
    const std::string name = kernels::batch_norm_tuning_text(tuning);
    double total = 0;
    for (size_t i = 0; i < std::size(shapes); ++i) {
      const Shape2& s = shapes[i];
      const int64_t rows = batch * s.side * s.side, n = rows * s.channels;
      // The work area is shared by shapes of other channel counts: zero, as the fused finalize's
      // counters must be when a channel count first uses it (kernels.hpp).
      CUDA_CHECK(cudaMemsetAsync(work, 0, work_bytes, stream));
      const double fwd = median_ms(stream, 20, [&] {
        kernels::batch_norm_forward_train(t, x, y, rows, s.channels, v[0], v[1], v[2], v[3], 0.1, 1e-5, true, v[4],
                                          v[5], work, stream);
      });
      const double bwd = median_ms(stream, 20, [&] {
        kernels::batch_norm_backward(t, x, dy, dx, rows, s.channels, v[0], v[4], v[5], 1.0f, v[6], v[7], work, stream,
                                     true);
      });
      total += static_cast<double>(s.count) * (fwd + bwd);
      // The bytes each must move: forward reads x twice (sums, apply) and writes y; backward reads
      // x and dy twice and writes dx; the ReLU backward reads y and dy and writes dx.
      const double b = 2.0 * static_cast<double>(n);
      std::printf("{\"workload\": \"batch_norm\", \"tuning\": \"%s\", \"rows\": %lld, \"channels\": %lld, "
                  "\"forward_ms\": %.4f, \"forward_GBps\": %.0f, \"backward_ms\": %.4f, \"backward_GBps\": %.0f, "
                  "\"relu_backward_ms\": %.4f, \"relu_backward_GBps\": %.0f}\n",
                  name.c_str(), static_cast<long long>(rows), static_cast<long long>(s.channels), fwd,
                  3 * b / fwd * 1e-6, bwd, 5 * b / bwd * 1e-6, relu[i], 3 * b / relu[i] * 1e-6);
    }
    totals.push_back({name, total});
  }
  kernels::set_batch_norm_tuning(chosen);
  // Per tuning, ResNet-50's 53 batch norms forward and backward, as counted above: the figure
  // to choose the default by (the ReLU backward on the same shapes: what a pass with no set-up
  // takes for 3/5 of the backward's bytes).
  std::sort(totals.begin(), totals.end(), [](const Total& a, const Total& b) { return a.ms < b.ms; });
  const std::string default_text = kernels::batch_norm_tuning_text({});
  for (const Total& tot : totals)
    std::printf("{\"workload\": \"batch_norm_resnet50\", \"tuning\": \"%s\", \"default\": %d, "
                "\"batch_norms_ms\": %.3f, \"relu_backward_ms\": %.3f}\n",
                tot.tuning.c_str(), tot.tuning == default_text ? 1 : 0, tot.ms, relu_total);
  cudaStreamDestroy(stream);
  for (void* p : {x, y, dy, dx, work, static_cast<void*>(vec)}) cudaFree(p);
  return 0;
}

int run(const Args& a) {
  if (device::cuda_device_count() == 0)
    throw Error(ErrorKind::Usage, "no CUDA GPU visible (" + device::describe() + "): gpu_step times the GPU");
  device::select_gpu(0);
  if (a.bn_tuning) kernels::set_batch_norm_tuning(*a.bn_tuning);
  if (a.copy_bandwidth) return copy_bandwidth();
  if (a.kernel_shapes) return kernel_shapes(a.batch);
  nn::ModelSpec spec;
  spec.kind = parse_named(nn::kModelNames, a.model, "model");
  spec.input = Shape{a.image_size, a.image_size, a.channels};
  spec.classes = a.classes;
  nn::Model<float> model(spec);
  model.init(1);
  optim::Sgd<float> sgd(model.params(), {0.9, true, 5e-4, false});
  nn::cuda::GpuContext ctx({math_of(a.precision), a.deterministic});
  nn::cuda::GpuNetwork net(ctx, model);
  net.upload(model.params());
  optim::SgdCuda sgd_gpu(sgd);

  const Tensor x = device_normal(nn::batch_shape(a.batch, spec.input), 2);
  std::vector<int32_t> labels(static_cast<size_t>(a.batch));
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int32_t>(i % static_cast<size_t>(a.classes));
  Tensor y(Shape{a.batch}, DType::I32, DeviceKind::CUDA);
  device::copy(y.raw(), labels.data(), labels.size() * sizeof(int32_t), device::Copy::HostToDevice);

  auto step = [&] {
    net.loss(net.forward(x, true), y.data<int32_t>());
    net.backward([](int64_t) {});
    auto& arenas = net.arenas();
    sgd_gpu.step(arenas.values().data<float>(), arenas.grads().data<float>(), 0.01, 0.9, ctx.stream());
  };
  for (int64_t i = 0; i < a.warmup; ++i) step();
  ctx.synchronize();
  // The warm-up settled every allocation and algorithm choice: the captured step's buffers stay.
  cudaGraphExec_t graph = nullptr;
  if (a.graphs) {
    cudaGraph_t g = nullptr;
    CUDA_CHECK(cudaStreamBeginCapture(ctx.stream(), cudaStreamCaptureModeThreadLocal));
    step();
    CUDA_CHECK(cudaStreamEndCapture(ctx.stream(), &g));
    CUDA_CHECK(cudaGraphInstantiate(&graph, g, 0));
    CUDA_CHECK(cudaGraphDestroy(g));
    CUDA_CHECK(cudaGraphLaunch(graph, ctx.stream()));  // its first launch uploads it: untimed
    ctx.synchronize();
  }
  auto timed_step = [&] {
    if (graph) CUDA_CHECK(cudaGraphLaunch(graph, ctx.stream()));
    else step();
  };
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  CUDA_CHECK(cudaEventRecord(start, ctx.stream()));
  for (int64_t i = 0; i < a.iters; ++i) timed_step();
  CUDA_CHECK(cudaEventRecord(stop, ctx.stream()));
  CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (graph) cudaGraphExecDestroy(graph);
  const double loss = net.sums().loss / static_cast<double>(a.batch);
  const double step_ms = ms / static_cast<double>(a.iters);
  std::printf(
      "{\"workload\": \"%s\", \"precision\": \"%s\", \"batch\": %lld, \"cuda_graphs\": %s, \"warmup\": %lld, "
      "\"iters\": %lld, \"step_ms\": %.4f, \"images_per_s\": %.1f, \"train_flops_per_sample\": %.0f, "
      "\"last_loss\": %.6g}\n",
      a.model.c_str(), a.precision.c_str(), static_cast<long long>(a.batch), a.graphs ? "true" : "false",
      static_cast<long long>(a.warmup),
      static_cast<long long>(a.iters), step_ms, 1000.0 * static_cast<double>(a.batch) / step_ms,
      model.train_flops_per_sample(), loss);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const po::error& e) {
    std::fprintf(stderr, "gpu_step: error: %s (try --help)\n", options::what_of(e).c_str());
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "gpu_step: error: %s\n", e.what());
    return e.kind() == ErrorKind::Usage ? 2 : 1;
  }
}

// hpctrain's training step on one GPU with the batch already there, timed as the PyTorch peer
// times its own (bench/torch_gpu_steps.py): --warmup steps (cuDNN's algorithm choice, the
// allocator's first requests), then --iters steps between two CUDA events. One step is what
// the GPU engine enqueues (train/gpu_engine.cpp): forward, loss, backward, the SGD update; the
// trainer also reads each step's loss back and stages each batch from the host, which this
// leaves out on purpose (bench/gpu_vs_peer.sh times the whole trainer separately).
// Prints one JSON line: images/s, ms per step, the model's training FLOPs per sample.
//   gpu_step [--model cnn] [--batch 128] [--image-size 28] [--channels 1] [--classes 10]
//            [--precision tf32] [--warmup 15] [--iters 50] [--no-deterministic] [--cuda-graphs]
// --cuda-graphs captures one step after the warm-up as a CUDA graph and times its replays, as
// the trainer's --cuda-graphs does: the GPU's time for the step without the host's launches.
// --copy-bandwidth instead measures the GPU's copy bandwidth, the roofline the kernels step of
// bench/gpu_vs_peer.sh holds every kernel against: a device-to-device copy of 2 GiB between two
// CUDA events, read plus written bytes over the time, the best of 10 after one untimed copy
// (JSON: copy_bytes_per_s).
#include <cuda_runtime_api.h>

#include <boost/program_options.hpp>

#include <cstdio>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "core/choice.hpp"
#include "core/device.hpp"
#include "core/error.hpp"
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
  bool deterministic = true, copy_bandwidth = false, graphs = false;
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
      "cuda-graphs", po::bool_switch(&a.graphs), "time replays of the step captured as a CUDA graph");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, d), vm);
  po::notify(vm);
  if (vm.count("help")) {
    std::cout << d;
    std::exit(0);
  }
  a.deterministic = !vm["no-deterministic"].as<bool>();
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

int run(const Args& a) {
  if (device::cuda_device_count() == 0)
    throw Error(ErrorKind::Usage, "no CUDA GPU visible (" + device::describe() + "): gpu_step times the GPU");
  device::select_gpu(0);
  if (a.copy_bandwidth) return copy_bandwidth();
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
    std::fprintf(stderr, "gpu_step: error: %s (try --help)\n", e.what());
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "gpu_step: error: %s\n", e.what());
    return e.kind() == ErrorKind::Usage ? 2 : 1;
  }
}

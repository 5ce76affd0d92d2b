// The shard loader against the trainer it feeds, on this machine's CPU, in one invocation:
//   1. decoded images/s of the training loader (pread, JPEG decode, random resized crop, flip,
//      normalisation) on one thread and on T threads, hence per core;
//   2. the images/s that hpctrain's CPU training step consumes for the same model and size
//      (forward, backward, SGD), on T threads;
// and their ratio: how many loader cores keep one trainer fed. Without --shards it makes its own
// dataset: photograph-sized JPEGs (noise over gradients, so that they compress like photos),
// packed with hpcdata's packer into a temporary directory. With --make-jpegs DIR it only writes
// those JPEGs, as an image folder (DIR/class<k>/<i>.jpg) for `hpcdata pack`, and exits
// (bench/gpu_vs_peer.sh's JPEG end-to-end run).
//
//   loader_throughput [--shards DIR] [--images 256] [--source 375x500] [--image-size 224]
//                     [--model resnet18] [--batch 16] [--steps 3] [--threads T]
//   loader_throughput --make-jpegs DIR [--images 256] [--source 375x500]
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <thread>

#include "cli.hpp"
#include "core/rng.hpp"
#include "data/dataset.hpp"
#include "data/jpeg.hpp"
#include "data/loader.hpp"
#include "data/pack.hpp"
#include "nn/gemm.hpp"
#include "nn/model.hpp"
#include "optim/sgd.hpp"

using namespace hpc;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Image i of the set: noise over gradients, so that it compresses like a photograph.
data::Image picture(int64_t i, int64_t h, int64_t w) {
  Philox rng(5, RngStream::Test, static_cast<uint64_t>(i));
  const int cls = static_cast<int>(i % 10);
  data::Image img;
  img.height = h;
  img.width = w;
  img.pixels.resize(static_cast<size_t>(h * w * 3));
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) {
        const double base = 128 + 60 * std::sin((x * (c + 1) + y * (cls + 1)) * 0.02);
        img.pixels[static_cast<size_t>((y * w + x) * 3 + c)] =
            static_cast<uint8_t>(std::clamp(base + 20 * rng.normal(), 0.0, 255.0));
      }
  return img;
}

// Photograph-sized JPEGs in root/class<k>/<i>.jpg (class i mod 10); each image from its own
// stream, so that they are made in parallel and are the same on any number of threads.
void write_jpegs(int64_t images, int64_t h, int64_t w, const fs::path& root) {
  for (int cls = 0; cls < 10; ++cls) fs::create_directories(root / ("class" + std::to_string(cls)));
  std::exception_ptr error;
  std::atomic<bool> failed{false};
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < images; ++i) {
    if (failed) continue;
    try {
      const fs::path file = root / ("class" + std::to_string(i % 10)) / (std::to_string(i) + ".jpg");
      const std::vector<uint8_t> jpeg = data::encode_jpeg(picture(i, h, w), 90);
      std::ofstream out(file.string(), std::ios::binary);
      out.write(reinterpret_cast<const char*>(jpeg.data()), static_cast<std::streamsize>(jpeg.size()));
      if (!out) throw std::runtime_error("cannot write " + file.string());
    } catch (...) {
#pragma omp critical
      if (!error) error = std::current_exception();
      failed = true;
    }
  }
  if (error) std::rethrow_exception(error);
}

std::string make_dataset(int64_t images, int64_t h, int64_t w, const fs::path& root) {
  write_jpegs(images, h, w, root / "src");
  for (const char* split : {"train", "val"}) {
    data::PackOptions o;
    o.src = (root / "src").string();
    o.out = (root / "packed").string();
    o.split = split;
    o.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    data::pack_image_folder(o);
  }
  return (root / "packed").string();
}

// Images/s of the training loader's assembly with `threads` decoding threads.
double loader_rate(const data::DatasetPair& ds, int threads, int64_t batch, int64_t& images_out) {
  const data::BatchAssembler a(ds.train, ds.norm, {0, true, true}, 1, threads);
  data::Batch b;
  std::vector<uint32_t> idx(static_cast<size_t>(batch));
  const int64_t batches = std::max<int64_t>(1, ds.train.count / batch);
  a.assemble(std::vector<uint32_t>{0}, 0, true, b);  // warm-up: buffers, decoder
  const auto t0 = Clock::now();
  for (int64_t k = 0; k < batches; ++k) {
    std::iota(idx.begin(), idx.end(), static_cast<uint32_t>(k * batch));
    a.assemble(idx, 1, true, b);
  }
  images_out = batches * batch;
  return static_cast<double>(images_out) / seconds_since(t0);
}

}  // namespace

int main(int argc, char** argv) {
  std::string shards, model_name = "resnet18", jpegs;
  int64_t images = 256, src_h = 375, src_w = 500, size = 224, batch = 16, steps = 3;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::string source = "375x500";
  bench::po::options_description desc(
      "Usage: loader_throughput [options]\n"
      "The shard loader's images/s against what hpctrain's CPU step consumes; with --make-jpegs DIR, only\n"
      "writes photograph-sized JPEGs as an image folder (DIR/class<k>/<i>.jpg) for hpcdata pack");
  desc.add_options()("shards", bench::po::value(&shards), "packed shards to read (default: made here)")(
      "make-jpegs", bench::po::value(&jpegs), "write the JPEGs into DIR and exit")(
      "images", bench::po::value(&images)->default_value(images), "JPEGs to make")(
      "source", bench::po::value(&source)->default_value(source), "HEIGHTxWIDTH of the JPEGs made")(
      "image-size", bench::po::value(&size)->default_value(size), "side of the crops the loader makes")(
      "model", bench::po::value(&model_name)->default_value(model_name), "the trainer's model (hpctrain --model)")(
      "batch", bench::po::value(&batch)->default_value(batch), "the trainer's batch")(
      "steps", bench::po::value(&steps)->default_value(steps), "the trainer's timed steps")(
      "threads", bench::po::value(&threads)->default_value(threads), "loader and trainer threads");
  const auto done = bench::read_command_line("loader_throughput", argc, argv, desc, [&] {
    char rest = 0;
    bench::require(std::sscanf(source.c_str(), "%ldx%ld%c", &src_h, &src_w, &rest) == 2 && src_h > 0 && src_w > 0 &&
                       src_h <= 65535 && src_w <= 65535,
                   "--source must be HEIGHTxWIDTH (1 to 65535 each), got '" + source + "'");
    bench::require(images >= 10 && images <= 100000000,
                   "--images must be 10 to 100000000 (one or more in each of the 10 class folders)");
    bench::require(size > 0 && size <= 65535, "--image-size must be 1 to 65535");
    bench::require(batch > 0 && batch <= 65536, "--batch must be 1 to 65536");
    bench::require(steps > 0 && steps <= 1000000, "--steps must be 1 to 1000000");
    bench::require(threads > 0 && threads <= 4096, "--threads must be 1 to 4096");
    parse_named(nn::kModelNames, model_name, "model");  // before the JPEGs are made, not after
  });
  if (done) return *done;
  return bench::run_main("loader_throughput", [&] {
    if (!jpegs.empty()) {
      write_jpegs(images, src_h, src_w, jpegs);
      std::printf("wrote %ld JPEGs of %ldx%ld in %s\n", images, src_h, src_w, jpegs.c_str());
      return 0;
    }
    // The JPEGs and shards made here, removed however the run ends (an error thrown included).
    struct Scratch {
      std::string dir;
      ~Scratch() {
        std::error_code ignored;
        if (!dir.empty()) fs::remove_all(dir, ignored);
      }
    } scratch;
    if (shards.empty()) {
      std::string pattern = (fs::temp_directory_path() / "loader-bench-XXXXXX").string();
      bench::require(mkdtemp(pattern.data()) != nullptr,
                     "cannot make a folder in " + fs::temp_directory_path().string() + ": " + std::strerror(errno));
      scratch.dir = pattern;
      std::printf("making %ld JPEGs of %ldx%ld and packing them in %s\n", images, src_h, src_w, pattern.c_str());
      shards = make_dataset(images, src_h, src_w, pattern);
    }
    const data::DatasetPair ds = data::load_dataset(data::DatasetKind::Shards, shards, size);
    int64_t n1 = 0, nt = 0;
    const double one = loader_rate(ds, 1, batch, n1);
    const double many = loader_rate(ds, threads, batch, nt);
    std::printf("loader: %ld images, %ldx%ld random resized crops: 1 thread %.1f img/s; %d threads %.1f img/s "
                "(%.1f img/s per core)\n",
                n1, size, size, one, threads, many, many / threads);

    nn::set_math_threads(threads);
    nn::ModelSpec spec;
    spec.kind = parse_named(nn::kModelNames, model_name, "model");
    spec.input = Shape{size, size, 3};
    spec.classes = ds.train.classes;
    nn::Model<float> model(spec);
    model.init(1);
    optim::Sgd<float> sgd(model.params(), {});
    const data::BatchAssembler a(ds.train, ds.norm, {0, true, true}, 1, threads);
    data::Batch b;
    std::vector<uint32_t> idx(static_cast<size_t>(batch));
    std::iota(idx.begin(), idx.end(), 0u);
    a.assemble(idx, 0, true, b);
    model.train_step(b.images, b.labels.data());  // warm-up
    sgd.step(model.params(), 0.01);
    const auto t0 = Clock::now();
    for (int64_t s = 0; s < steps; ++s) {
      model.train_step(b.images, b.labels.data());
      sgd.step(model.params(), 0.01);
    }
    const double train = static_cast<double>(steps * batch) / seconds_since(t0);
    std::printf("trainer: %s %ldx%ld on the CPU, %d threads, batch %ld: %.1f img/s\n", model_name.c_str(), size, size,
                threads, batch, train);
    std::printf("one loader core decodes %.1fx what the trainer consumes; %.2f cores keep it fed\n",
                (many / threads) / train, train / (many / threads));
    std::printf("loader_images_per_second_1_thread=%.2f\nloader_images_per_second=%.2f\nloader_threads=%d\n"
                "loader_images_per_second_per_core=%.2f\ntrainer_images_per_second=%.2f\n"
                "loader_cores_per_trainer=%.3f\n",
                one, many, threads, many / threads, train, train / (many / threads));
    return 0;
  });
}

// gemm_shapes: times oneDNN's dnnl_sgemm against OpenBLAS's cblas_sgemm on the row-major
// float GEMMs that the CPU layers issue for the `cnn` model at batch 64 (NHWC im2col, conv
// weights Cout x K with K = 3*3*Cin), plus one 2048^3 square for the machine's sgemm peak.
// The result chose HPCTRAIN_CPU_GEMM's default; bench/cpu_vs_peer.sh reads the peak from
// `--peak-only` to say what fraction of it training reaches.
#include <cblas.h>
#include <dnnl.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli.hpp"

namespace {

// One C = op(A) * op(B) + beta * C as a layer calls it (src/nn/conv.cpp, simple_layers.cpp).
// op(A) is M x K, op(B) is K x N; a transposed operand is stored the other way round.
struct Shape {
  const char* name;
  bool trans_a, trans_b;
  int64_t m, n, k;
  float beta;  // the forward passes accumulate onto the bias (beta 1); gradients overwrite
  int64_t lda() const { return trans_a ? m : k; }
  int64_t ldb() const { return trans_b ? k : n; }
  double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k); }
};

// cnn on 28x28x1 at batch 64: conv1 3x3 1->32 on 28x28, conv2 3x3 32->64 on 14x14, fc1 3136->128.
// conv1 has no input gradient (it is the first layer), so it has no dcol product.
const std::vector<Shape> kLayerShapes = {
    {"conv1.fwd", false, true, 64 * 28 * 28, 32, 9, 1},      // y = col * W^T
    {"conv1.dW", true, false, 32, 9, 64 * 28 * 28, 0},       // dW = dY^T * col
    {"conv2.fwd", false, true, 64 * 14 * 14, 64, 288, 1},
    {"conv2.dW", true, false, 64, 288, 64 * 14 * 14, 0},
    {"conv2.dcol", false, false, 64 * 14 * 14, 288, 64, 0},  // dcol = dY * W
    {"fc1.fwd", false, true, 64, 128, 3136, 1},              // y = x * W^T
    {"fc1.dW", true, false, 128, 3136, 64, 0},               // dW = dY^T * x
    {"fc1.dx", false, false, 64, 3136, 128, 0},              // dx = dY * W
};
const Shape kSquare = {"square2048", false, false, 2048, 2048, 2048, 0};

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<float[], FreeDeleter>;

// 64-byte aligned, as the layers' arenas are, so neither library pays for misalignment.
Buffer make_buffer(int64_t elems, std::mt19937& rng) {
  const size_t bytes = (static_cast<size_t>(elems) * sizeof(float) + 63) / 64 * 64;
  auto* p = static_cast<float*>(std::aligned_alloc(64, bytes));
  if (!p) throw std::runtime_error("out of memory");
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int64_t i = 0; i < elems; ++i) p[i] = dist(rng);
  return Buffer(p);
}

enum class Backend { Onednn, Openblas };
const char* backend_name(Backend b) { return b == Backend::Onednn ? "onednn" : "openblas"; }

void run_gemm(Backend b, const Shape& s, const float* a, const float* bm, float* c) {
  if (b == Backend::Onednn) {
    const dnnl_status_t st = dnnl_sgemm(s.trans_a ? 'T' : 'N', s.trans_b ? 'T' : 'N', s.m, s.n, s.k, 1.0f, a,
                                        s.lda(), bm, s.ldb(), s.beta, c, s.n);
    if (st != dnnl_success)
      throw std::runtime_error(std::string("dnnl_sgemm failed on ") + s.name + " with status " +
                               std::to_string(static_cast<int>(st)));
  } else {
    cblas_sgemm(CblasRowMajor, s.trans_a ? CblasTrans : CblasNoTrans, s.trans_b ? CblasTrans : CblasNoTrans,
                static_cast<int>(s.m), static_cast<int>(s.n), static_cast<int>(s.k), 1.0f, a,
                static_cast<int>(s.lda()), bm, static_cast<int>(s.ldb()), s.beta, c, static_cast<int>(s.n));
  }
}

using Clock = std::chrono::steady_clock;

// Median seconds per call. Each sample times enough back-to-back calls to last about
// `sample_seconds`, so that millisecond-sized products are not lost in timer noise.
double time_gemm(Backend b, const Shape& s, const float* a, const float* bm, float* c, int samples,
                 double sample_seconds) {
  run_gemm(b, s, a, bm, c);  // warm-up: JIT kernels, thread pools, caches, page faults
  auto t0 = Clock::now();
  run_gemm(b, s, a, bm, c);
  const double one = std::chrono::duration<double>(Clock::now() - t0).count();
  const int calls = std::clamp(static_cast<int>(sample_seconds / std::max(one, 1e-9)), 1, 10000);
  std::vector<double> per_call;
  for (int i = 0; i < samples; ++i) {
    t0 = Clock::now();
    for (int j = 0; j < calls; ++j) run_gemm(b, s, a, bm, c);
    per_call.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / calls);
  }
  std::nth_element(per_call.begin(), per_call.begin() + samples / 2, per_call.end());
  return per_call[samples / 2];
}

struct Result {
  double gflops[2];
  double max_rel_diff;  // between the two backends' C: a wrong transpose or ld shows up here
};

Result measure(const Shape& s, int samples, double sample_seconds) {
  std::mt19937 rng(12345);
  const Buffer a = make_buffer(s.m * s.k, rng), bm = make_buffer(s.k * s.n, rng);
  const Buffer c0 = make_buffer(s.m * s.n, rng);
  Buffer c[2] = {make_buffer(s.m * s.n, rng), make_buffer(s.m * s.n, rng)};
  Result r{};
  for (Backend b : {Backend::Onednn, Backend::Openblas}) {
    float* cb = c[static_cast<int>(b)].get();
    const double sec = time_gemm(b, s, a.get(), bm.get(), cb, samples, sample_seconds);
    r.gflops[static_cast<int>(b)] = s.flops() / sec / 1e9;
    // One clean call from the same C for the comparison (beta 1 accumulated while timing).
    std::copy(c0.get(), c0.get() + s.m * s.n, cb);
    run_gemm(b, s, a.get(), bm.get(), cb);
  }
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < s.m * s.n; ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(c[0][i] - c[1][i])));
    scale = std::max(scale, static_cast<double>(std::fabs(c[1][i])));
  }
  r.max_rel_diff = diff / std::max(scale, 1e-30);
  return r;
}

void check_agreement(const Shape& s, const Result& r) {
  // Float sums of up to 50k terms in different orders differ by far less than this.
  if (!(r.max_rel_diff < 1e-3))
    throw std::runtime_error(std::string("the backends disagree on ") + s.name + " (max relative difference " +
                             std::to_string(r.max_rel_diff) + "): wrong transpose or leading dimension");
}

struct Options {
  int threads = 1;
  int samples = 7;
  double sample_seconds = 0.05;
  bool peak_only = false;
};

// --help, or a usage error (one line, exit 2): the exit code to end with; else nothing.
std::optional<int> parse(int argc, char** argv, Options& o) {
  namespace po = hpc::bench::po;
  po::options_description desc(
      "Usage: gemm_shapes [options]\n"
      "Times dnnl_sgemm and cblas_sgemm on the cnn model's layer GEMMs (batch 64) and a 2048^3 square");
  desc.add_options()("threads", po::value(&o.threads)->default_value(o.threads), "threads for both libraries")(
      "samples", po::value(&o.samples)->default_value(o.samples), "timed samples per shape; the median is kept")(
      "sample-seconds", po::value(&o.sample_seconds)->default_value(o.sample_seconds),
      "approximate length of one sample")("peak-only", po::bool_switch(&o.peak_only),
                                          "time only the square and print peak_sgemm_gflops=<GFLOP/s>");
  return hpc::bench::read_command_line("gemm_shapes", argc, argv, desc, [&] {
    hpc::bench::require(o.threads >= 1 && o.threads <= 4096, "--threads must be between 1 and 4096");
    hpc::bench::require(o.samples >= 1 && o.samples <= 1000, "--samples must be between 1 and 1000");
    hpc::bench::require(o.sample_seconds > 0 && o.sample_seconds <= 10, "--sample-seconds must be in (0, 10]");
  });
}

void print_row(const Shape& s, const Result& r) {
  const int faster = r.gflops[0] >= r.gflops[1] ? 0 : 1;
  std::printf("%-11s %c %c %7lld %6lld %7lld %10.1f %10.1f  %-8s %6.2fx %9.1e\n", s.name, s.trans_a ? 'T' : 'N',
              s.trans_b ? 'T' : 'N', static_cast<long long>(s.m), static_cast<long long>(s.n),
              static_cast<long long>(s.k), r.gflops[0], r.gflops[1], backend_name(static_cast<Backend>(faster)),
              r.gflops[faster] / std::max(r.gflops[1 - faster], 1e-9), r.max_rel_diff);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (const auto done = parse(argc, argv, o)) return *done;
  try {
    openblas_set_num_threads(o.threads);
    omp_set_num_threads(o.threads);  // oneDNN runs on OpenMP
    if (o.peak_only) {
      const Result r = measure(kSquare, o.samples, o.sample_seconds);
      check_agreement(kSquare, r);
      std::printf("peak_sgemm_gflops=%.1f\n", std::max(r.gflops[0], r.gflops[1]));
      return 0;
    }
    const dnnl_version_t* v = dnnl_version();
    std::printf("gemm_shapes: row-major sgemm, %d thread(s), median of %d samples of ~%.0f ms\n", o.threads,
                o.samples, o.sample_seconds * 1e3);
    std::printf("onednn %d.%d.%d (cpu runtime %s); openblas %s\n", v->major, v->minor, v->patch,
                (v->cpu_runtime & DNNL_RUNTIME_OMP) ? "omp" : "other", openblas_get_config());
    std::printf("%-11s %s %s %7s %6s %7s %10s %10s  %-8s %7s %9s\n", "shape", "A", "B", "M", "N", "K", "onednn",
                "openblas", "faster", "by", "rel.diff");
    std::printf("%-11s %3s %7s %6s %7s %10s %10s\n", "", "", "", "", "", "GFLOP/s", "GFLOP/s");
    double layer_seconds[2] = {0, 0};
    for (const Shape& s : kLayerShapes) {
      const Result r = measure(s, o.samples, o.sample_seconds);
      check_agreement(s, r);
      print_row(s, r);
      for (int b = 0; b < 2; ++b) layer_seconds[b] += s.flops() / (r.gflops[b] * 1e9);
    }
    double layer_flops = 0;
    for (const Shape& s : kLayerShapes) layer_flops += s.flops();
    std::printf("%-11s %3s %7s %6s %7s %10.1f %10.1f  (the layer GEMMs of one step, time-weighted)\n", "all layers",
                "", "", "", "", layer_flops / layer_seconds[0] / 1e9, layer_flops / layer_seconds[1] / 1e9);
    const Result r = measure(kSquare, o.samples, o.sample_seconds);
    check_agreement(kSquare, r);
    print_row(kSquare, r);
    std::printf("peak_sgemm_gflops=%.1f\n", std::max(r.gflops[0], r.gflops[1]));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gemm_shapes: error: %s\n", e.what());
    return 1;
  }
}

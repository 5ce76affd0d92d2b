#include <dnnl.h>

#include <algorithm>

#include "core/error.hpp"
#include "nn/dnnl_kernels.hpp"
#include "nn/gemm.hpp"
#include "nn/parallel.hpp"

namespace hpc::nn {

namespace {
// The product is cut into tiles of C by its shape alone, and each tile is one single-threaded
// dnnl_sgemm, so its bits are the same on any number of threads. Left to its own threading,
// dnnl_sgemm splits K among threads for some shapes (from 2 threads for 64x256x784, from 8 for
// the cnn's first dense layer, 32x128x3136), and a run then ends on other bits where its
// thread count differs, as after a resume on another host.
constexpr int64_t kTileWork = int64_t{1} << 22;  // multiply-adds a tile is worth cutting for
constexpr int64_t kMaxTiles = 64, kMinTileRows = 32, kMinTileCols = 64, kColumnAlign = 16;

struct Tiling {
  int64_t rows = 1, cols = 1;  // tiles down M and across N
};

Tiling tiling(int64_t m, int64_t n, int64_t k) {
  const double work = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  const auto wanted = static_cast<int64_t>(std::clamp(work / kTileWork, 1.0, static_cast<double>(kMaxTiles)));
  Tiling t;
  t.rows = std::clamp<int64_t>(m / kMinTileRows, 1, wanted);
  t.cols = std::clamp<int64_t>(n / kMinTileCols, 1, std::max<int64_t>(wanted / t.rows, 1));
  return t;
}

// Where tile i of `count` across `size` begins; columns on a multiple of 16 floats (a vector).
int64_t tile_start(int64_t i, int64_t count, int64_t size, int64_t align) {
  if (i >= count) return size;
  return size * i / count / align * align;
}

// One tile, on one thread (each_on_one_thread).
dnnl_status_t one_tile(bool trans_a, bool trans_b, int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t k,
                       float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                       int64_t ldc) {
  const float* at = trans_a ? a + i0 : a + i0 * lda;
  const float* bt = trans_b ? b + j0 * ldb : b + j0;
  return dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', i1 - i0, j1 - j0, k, alpha, at, lda, bt, ldb, beta,
                    c + i0 * ldc + j0, ldc);
}
}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const Tiling t = tiling(m, n, k);
  each_on_one_thread(t.rows * t.cols, [&](int64_t i) {
    const int64_t r = i / t.cols, q = i % t.cols;
    const dnnl_status_t st = one_tile(trans_a, trans_b, tile_start(r, t.rows, m, 1), tile_start(r + 1, t.rows, m, 1),
                                      tile_start(q, t.cols, n, kColumnAlign), tile_start(q + 1, t.cols, n, kColumnAlign),
                                      k, alpha, a, lda, b, ldb, beta, c, ldc);
    HPC_CHECK(st == dnnl_success, "dnnl_sgemm failed with status ", static_cast<int>(st), " (m=", m, " n=", n, " k=", k,
              ")");
  });
}

const char* gemm_backend() { return "onednn"; }
std::string gemm_kernels() { return detail::dnnl_kernels(); }

}  // namespace hpc::nn

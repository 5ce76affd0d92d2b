// Winograd F(2x2, 3x3) convolution (Lavin and Gray, "Fast Algorithms for Convolutional Neural
// Networks", 2015) for float 3x3 convolutions with stride 1 and padding 1 over NHWC
// activations: each 2x2 block of outputs (a tile) costs 16 multiplications per input and
// output channel pair instead of 36, so the three products of a training step do 2.25x fewer
// multiply-adds than a direct convolution. Those products become 16 GEMMs per block of tiles
// (one per point of the 4x4 transformed tile), which run at the BLAS's rate on any ISA; the
// transforms around them are additions, vectorised over channels by the compiler. On AVX2,
// where oneDNN has no Winograd kernel, this is what brings the cnn's conv2 below the direct
// kernel's time (docs/performance.md).
//
//   forward          y  = A^T [ (G g G^T) . (B^T d B) ] A   per tile, summed over channels
//   backward data    the same with the weights flipped and in/out channels swapped
//   backward weights dg = G^T [ sum over tiles (A dy A^T) . (B^T d B) ] G
//
// Tiles are processed in blocks sized so that a block's transformed tiles stay in the L2
// cache between the transforms and the GEMMs. Blocks are split among the math threads;
// every output element is computed by one thread in a fixed order, and the weight gradient
// is summed over a fixed split of the blocks, so the results have the same bits on any
// number of threads.
#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "nn/gemm.hpp"
#include "nn/library_conv.hpp"
#include "nn/parallel.hpp"

namespace hpc::nn {
namespace {

constexpr int kPoints = 16;                 // the 4x4 transformed tile
constexpr int64_t kBlockBytes = 512 << 10;  // a block's transformed inputs and outputs
constexpr int64_t kWeightGradGroups = 8;     // the weight gradient's partial sums (below)

// Tiles per block for products with `in` input and `out` output channels.
int64_t tiles_per_block(int64_t in, int64_t out) {
  const int64_t t = kBlockBytes / (kPoints * (in + out) * static_cast<int64_t>(sizeof(float)));
  return std::clamp<int64_t>(t / 4 * 4, 16, 512);
}

// The 4x4 input patch of a tile, as 16 pointers to C contiguous channels (a row of zeros
// outside the image), and its output pixels.
struct TileGrid {
  int64_t h, w, th, tw;  // image size, tiles per column and row
  int64_t tiles(int64_t n) const { return n * th * tw; }
  // Input rows/cols 2i-1 .. 2i+2 of image n for tile t (n, i, j from t).
  void patch(const float* x, int64_t c, int64_t t, const float* zeros, const float* p[kPoints]) const {
    const int64_t n = t / (th * tw), i = t / tw % th, j = t % tw;
    const float* xn = x + n * h * w * c;
    for (int a = 0; a < 4; ++a) {
      const int64_t r = 2 * i - 1 + a;
      for (int b = 0; b < 4; ++b) {
        const int64_t q = 2 * j - 1 + b;
        p[a * 4 + b] = (r < 0 || r >= h || q < 0 || q >= w) ? zeros : xn + (r * w + q) * c;
      }
    }
  }
  // The 2x2 output pixels of tile t in y (C channels each); one past the image's last row or
  // column (odd sizes) is outside + e * outside_stride instead.
  template <class P>
  void outputs(P y, int64_t c, int64_t t, P outside, int64_t outside_stride, P o[4]) const {
    const int64_t n = t / (th * tw), i = t / tw % th, j = t % tw;
    for (int a = 0; a < 2; ++a)
      for (int b = 0; b < 2; ++b) {
        const int64_t r = 2 * i + a, q = 2 * j + b;
        o[a * 2 + b] = (r < h && q < w) ? y + ((n * h + r) * w + q) * c : outside + (a * 2 + b) * outside_stride;
      }
  }
};

// V[pt][t][c] = (B^T d B)[pt] for tiles t0 .. t0+nt of x (C channels); ld = nt * C.
void transform_inputs(const TileGrid& grid, const float* __restrict x, int64_t c, int64_t t0, int64_t nt,
                      const float* zeros, float* __restrict v) {
  const int64_t ld = nt * c;
  for (int64_t t = 0; t < nt; ++t) {
    const float* p[kPoints];
    grid.patch(x, c, t0 + t, zeros, p);
    float* __restrict o = v + t * c;
#pragma omp simd
    for (int64_t k = 0; k < c; ++k) {
      float d[kPoints], s[kPoints];
      for (int e = 0; e < kPoints; ++e) d[e] = p[e][k];
      for (int b = 0; b < 4; ++b) {  // B^T d: rows
        s[0 * 4 + b] = d[0 * 4 + b] - d[2 * 4 + b];
        s[1 * 4 + b] = d[1 * 4 + b] + d[2 * 4 + b];
        s[2 * 4 + b] = d[2 * 4 + b] - d[1 * 4 + b];
        s[3 * 4 + b] = d[1 * 4 + b] - d[3 * 4 + b];
      }
      for (int a = 0; a < 4; ++a) {  // (B^T d) B: columns
        o[(a * 4 + 0) * ld + k] = s[a * 4 + 0] - s[a * 4 + 2];
        o[(a * 4 + 1) * ld + k] = s[a * 4 + 1] + s[a * 4 + 2];
        o[(a * 4 + 2) * ld + k] = s[a * 4 + 2] - s[a * 4 + 1];
        o[(a * 4 + 3) * ld + k] = s[a * 4 + 1] - s[a * 4 + 3];
      }
    }
  }
}

// y (2x2 per tile, K channels) = A^T m A (+ bias) from M[pt][t][k]; ld = nt * K. Outputs
// past the image's last row or column (odd sizes) are dropped.
void transform_outputs(const TileGrid& grid, const float* __restrict m, int64_t kc, int64_t t0, int64_t nt,
                       const float* bias, const float* zeros, float* __restrict y) {
  const int64_t ld = nt * kc;
  const float* b = bias ? bias : zeros;
  std::vector<float> scratch(static_cast<size_t>(4 * kc));
  for (int64_t t = 0; t < nt; ++t) {
    float* out[4];
    grid.outputs(y, kc, t0 + t, scratch.data(), kc, out);
    float* __restrict o0 = out[0];
    float* __restrict o1 = out[1];
    float* __restrict o2 = out[2];
    float* __restrict o3 = out[3];
    const float* mt = m + t * kc;
#pragma omp simd
    for (int64_t k = 0; k < kc; ++k) {
      float e[kPoints], s[8];
      for (int p = 0; p < kPoints; ++p) e[p] = mt[p * ld + k];
      for (int c = 0; c < 4; ++c) {  // A^T m: two rows
        s[0 * 4 + c] = e[0 * 4 + c] + e[1 * 4 + c] + e[2 * 4 + c];
        s[1 * 4 + c] = e[1 * 4 + c] - e[2 * 4 + c] - e[3 * 4 + c];
      }
      o0[k] = b[k] + s[0] + s[1] + s[2];
      o1[k] = b[k] + s[1] - s[2] - s[3];
      o2[k] = b[k] + s[4] + s[5] + s[6];
      o3[k] = b[k] + s[5] - s[6] - s[7];
    }
  }
}

// Z[pt][t][k] = (A dy A^T)[pt] for tiles t0 .. t0+nt of dy (K channels; zero past the edge).
void transform_output_grads(const TileGrid& grid, const float* __restrict dy, int64_t kc, int64_t t0, int64_t nt,
                            const float* zeros, float* __restrict z) {
  const int64_t ld = nt * kc;
  for (int64_t t = 0; t < nt; ++t) {
    const float* in[4];
    grid.outputs(dy, kc, t0 + t, zeros, 0, in);
    float* __restrict o = z + t * kc;
#pragma omp simd
    for (int64_t k = 0; k < kc; ++k) {
      const float d00 = in[0][k], d01 = in[1][k], d10 = in[2][k], d11 = in[3][k];
      // A D: rows [D0, D0 + D1, D0 - D1, -D1]; then the same over columns.
      const float r[4][2] = {{d00, d01}, {d00 + d10, d01 + d11}, {d00 - d10, d01 - d11}, {-d10, -d11}};
      for (int a = 0; a < 4; ++a) {
        o[(a * 4 + 0) * ld + k] = r[a][0];
        o[(a * 4 + 1) * ld + k] = r[a][0] + r[a][1];
        o[(a * 4 + 2) * ld + k] = r[a][0] - r[a][1];
        o[(a * 4 + 3) * ld + k] = -r[a][1];
      }
    }
  }
}

// G g G^T for one 3x3 kernel g (row-major).
std::array<float, kPoints> transform_kernel(const float g[9]) {
  float s[12];  // G g: 4 x 3
  for (int c = 0; c < 3; ++c) {
    s[0 * 3 + c] = g[0 * 3 + c];
    s[1 * 3 + c] = 0.5f * (g[0 * 3 + c] + g[1 * 3 + c] + g[2 * 3 + c]);
    s[2 * 3 + c] = 0.5f * (g[0 * 3 + c] - g[1 * 3 + c] + g[2 * 3 + c]);
    s[3 * 3 + c] = g[2 * 3 + c];
  }
  std::array<float, kPoints> u{};
  for (int a = 0; a < 4; ++a) {
    u[a * 4 + 0] = s[a * 3 + 0];
    u[a * 4 + 1] = 0.5f * (s[a * 3 + 0] + s[a * 3 + 1] + s[a * 3 + 2]);
    u[a * 4 + 2] = 0.5f * (s[a * 3 + 0] - s[a * 3 + 1] + s[a * 3 + 2]);
    u[a * 4 + 3] = s[a * 3 + 2];
  }
  return u;
}

// G^T u G: the 3x3 kernel gradient from a 4x4 transformed one.
std::array<float, 9> untransform_kernel_grad(const float u[kPoints]) {
  float s[12];  // G^T u: 3 x 4
  for (int c = 0; c < 4; ++c) {
    s[0 * 4 + c] = u[0 * 4 + c] + 0.5f * (u[1 * 4 + c] + u[2 * 4 + c]);
    s[1 * 4 + c] = 0.5f * (u[1 * 4 + c] - u[2 * 4 + c]);
    s[2 * 4 + c] = 0.5f * (u[1 * 4 + c] + u[2 * 4 + c]) + u[3 * 4 + c];
  }
  std::array<float, 9> g{};
  for (int a = 0; a < 3; ++a) {
    g[a * 3 + 0] = s[a * 4 + 0] + 0.5f * (s[a * 4 + 1] + s[a * 4 + 2]);
    g[a * 3 + 1] = 0.5f * (s[a * 4 + 1] - s[a * 4 + 2]);
    g[a * 3 + 2] = 0.5f * (s[a * 4 + 1] + s[a * 4 + 2]) + s[a * 4 + 3];
  }
  return g;
}

class WinogradConv final : public LibraryConv {
 public:
  explicit WinogradConv(const ConvGeometry& g)
      : n_(g.n), cin_(g.cin), cout_(g.cout), bias_(g.bias), grid_{g.h, g.w, (g.h + 1) / 2, (g.w + 1) / 2},
        zeros_(static_cast<size_t>(std::max(g.cin, g.cout)), 0.0f) {}

  bool forward(const float* x, const float* w, const float* b, float* y) override {
    transform_weights(w, /*flip=*/false);
    run(x, cin_, cout_, b, y);
    return true;
  }

  bool backward_data(const float* dy, const float* w, float* dx) override {
    transform_weights(w, /*flip=*/true);
    run(dy, cout_, cin_, nullptr, dx);
    return true;
  }

  bool backward_weights(const float* x, const float* dy, float* dw, float* db) override {
    const int64_t tiles = grid_.tiles(n_), block = tiles_per_block(cin_, cout_);
    const int64_t blocks = (tiles + block - 1) / block;
    const int64_t du_size = kPoints * cin_ * cout_, buffers = kPoints * block * (cin_ + cout_);
    // The blocks fall into a fixed number of groups, whatever the thread count: each group's
    // sum is accumulated in block order and the groups' sums are added in group order, so the
    // threads only share out whole groups and the gradient has the same bits on any number
    // of them (as oneDNN's direct kernel had).
    const int64_t groups = std::min(kWeightGradGroups, blocks);
    const int max_parts = static_cast<int>(std::min<int64_t>(groups, math_threads()));
    scratch_.resize(static_cast<size_t>(max_parts * buffers + groups * du_size));
    float* const sums = scratch_.data() + max_parts * buffers;
    parallel_rows(groups, 1, max_parts, [&](int64_t g0, int64_t g1, int part) {
      float* v = scratch_.data() + part * buffers;
      float* z = v + kPoints * block * cin_;
      for (int64_t group = g0; group < g1; ++group) {
        float* du = sums + group * du_size;
        const int64_t b0 = blocks * group / groups, b1 = blocks * (group + 1) / groups;
        for (int64_t bl = b0; bl < b1; ++bl) {
          const int64_t t0 = bl * block, nt = std::min(block, tiles - t0);
          transform_inputs(grid_, x, cin_, t0, nt, zeros_.data(), v);
          transform_output_grads(grid_, dy, cout_, t0, nt, zeros_.data(), z);
          for (int p = 0; p < kPoints; ++p)  // dU[p] (C x K) += V[p]^T Z[p]
            gemm(true, false, cin_, cout_, nt, 1.0f, v + p * nt * cin_, cin_, z + p * nt * cout_, cout_,
                 bl == b0 ? 0.0f : 1.0f, du + p * cin_ * cout_, cout_);
        }
      }
    });
    float* du = sums;
    for (int64_t group = 1; group < groups; ++group) {
      const float* other = sums + group * du_size;
      for (int64_t i = 0; i < du_size; ++i) du[i] += other[i];
    }
    for (int64_t k = 0; k < cout_; ++k)
      for (int64_t c = 0; c < cin_; ++c) {
        float u[kPoints];
        for (int p = 0; p < kPoints; ++p) u[p] = du[(p * cin_ + c) * cout_ + k];
        const std::array<float, 9> g = untransform_kernel_grad(u);
        for (int e = 0; e < 9; ++e) dw[(k * 9 + e) * cin_ + c] = g[e];
      }
    if (bias_) {
      std::fill(db, db + cout_, 0.0f);
      const int64_t pixels = n_ * grid_.h * grid_.w;
      for (int64_t r = 0; r < pixels; ++r)
        for (int64_t k = 0; k < cout_; ++k) db[k] += dy[r * cout_ + k];
    }
    return true;
  }

 private:
  // U[p][i][o] = (G g G^T)[p] for the kernel from input channel i to output channel o: the
  // layer's own (w is Cout x 3 x 3 x Cin), or for the backward data pass the kernel of the
  // transposed convolution, w rotated by 180 degrees with in and out swapped.
  void transform_weights(const float* w, bool flip) {
    const int64_t in = flip ? cout_ : cin_, out = flip ? cin_ : cout_;
    u_.resize(static_cast<size_t>(kPoints * in * out));
    for (int64_t k = 0; k < cout_; ++k)
      for (int64_t c = 0; c < cin_; ++c) {
        float g[9];
        for (int e = 0; e < 9; ++e) g[flip ? 8 - e : e] = w[(k * 9 + e) * cin_ + c];
        const std::array<float, kPoints> u = transform_kernel(g);
        const int64_t i = flip ? k : c, o = flip ? c : k;
        for (int p = 0; p < kPoints; ++p) u_[(p * in + i) * out + o] = u[p];
      }
  }

  // y = the convolution of x (in channels) with u_ (to out channels), plus bias.
  void run(const float* x, int64_t in, int64_t out, const float* bias, float* y) {
    const int64_t tiles = grid_.tiles(n_), block = tiles_per_block(in, out);
    const int64_t blocks = (tiles + block - 1) / block;
    const int max_parts = static_cast<int>(std::min<int64_t>(blocks, math_threads()));
    const int64_t part_size = kPoints * block * (in + out);
    scratch_.resize(static_cast<size_t>(max_parts * part_size));
    parallel_rows(blocks, 1, max_parts, [&](int64_t b0, int64_t b1, int part) {
      float* v = scratch_.data() + part * part_size;
      float* m = v + kPoints * block * in;
      for (int64_t bl = b0; bl < b1; ++bl) {
        const int64_t t0 = bl * block, nt = std::min(block, tiles - t0);
        transform_inputs(grid_, x, in, t0, nt, zeros_.data(), v);
        for (int p = 0; p < kPoints; ++p)  // M[p] (tiles x out) = V[p] (tiles x in) U[p] (in x out)
          gemm(false, false, nt, out, in, 1.0f, v + p * nt * in, in, u_.data() + p * in * out, out, 0.0f,
               m + p * nt * out, out);
        transform_outputs(grid_, m, out, t0, nt, bias, zeros_.data(), y);
      }
    });
  }

  int64_t n_, cin_, cout_;
  bool bias_;
  TileGrid grid_;
  std::vector<float> zeros_, u_, scratch_;
};

}  // namespace

// At least 8 channels each way, so the GEMMs have some depth; at most 128 x 128 channel
// pairs, so that one point's transformed kernels (64 KiB) stay in the L2 cache beside a block
// of tiles: every block reads all 16 of them again, and wider layers would stream them from
// memory once per block.
bool winograd_fits(const ConvGeometry& g) {
  return g.kernel == 3 && g.stride == 1 && g.padding == 1 && g.cin >= 8 && g.cout >= 8 &&
         g.cin * g.cout <= 128 * 128;
}

std::unique_ptr<LibraryConv> make_winograd_conv(const ConvGeometry& g) {
  return winograd_fits(g) ? std::make_unique<WinogradConv>(g) : nullptr;
}

}  // namespace hpc::nn

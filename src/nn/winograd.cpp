// Winograd convolution (Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks",
// 2015) for float 3x3 convolutions with stride 1 and padding 1 over NHWC activations, with
// tiles of 2x2 or 4x4 outputs. F(2x2, 3x3) computes a tile from a 4x4 input patch with 16
// multiplications per input and output channel pair instead of 36 (2.25x fewer multiply-adds
// than a direct convolution); F(4x4, 3x3) from a 6x6 patch with 36 instead of 144 (4x fewer,
// less where its tiles hang over the image's edge; its rounding errors are about ten times
// F(2x2)'s, a few 1e-6 relative). The products become one GEMM per point of the transformed
// tile (16 or 36) per block of tiles, which run at the BLAS's rate on any ISA; the transforms
// around them are additions, vectorised over channels by the compiler. On AVX2, where oneDNN
// has no Winograd kernel, this is what brings the cnn's conv2 below the direct kernel's time
// (docs/performance.md); winograd_tile (below) says which tile a layer gets.
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
#include <cstring>
#include <vector>

#include "core/error.hpp"
#include "nn/gemm.hpp"
#include "nn/library_conv.hpp"
#include "nn/parallel.hpp"

namespace hpc::nn {
namespace {

constexpr int64_t kBlockBytes = 512 << 10;  // a block's transformed inputs and outputs
constexpr int64_t kWeightGradGroups = 8;     // the weight gradient's partial sums (below)

// F(M x M, 3 x 3): M x M outputs per tile from an A x A input patch, A = M + 2, and as many
// points (GEMMs) per tile as the patch has values.
template <int M>
struct Tile {
  static constexpr int kAlpha = M + 2, kPoints = kAlpha * kAlpha, kOut = M * M;
};

// Tiles per block for products with `in` input and `out` output channels.
template <int M>
int64_t tiles_per_block(int64_t in, int64_t out) {
  const int64_t t = kBlockBytes / (Tile<M>::kPoints * (in + out) * static_cast<int64_t>(sizeof(float)));
  return std::clamp<int64_t>(t / 4 * 4, 16, 512);
}

// The A x A input patch of a tile, as pointers to C contiguous channels (a row of zeros
// outside the image), and its M x M output pixels.
template <int M>
struct TileGrid {
  static constexpr int kAlpha = Tile<M>::kAlpha;
  int64_t h, w, th, tw;  // image size, tiles per column and row
  TileGrid(int64_t height, int64_t width) : h(height), w(width), th((height + M - 1) / M), tw((width + M - 1) / M) {}
  int64_t tiles(int64_t n) const { return n * th * tw; }
  // Input rows/cols M*i-1 .. M*i+M of image n for tile t (n, i, j from t).
  void patch(const float* x, int64_t c, int64_t t, const float* zeros, const float* p[Tile<M>::kPoints]) const {
    const int64_t n = t / (th * tw), i = t / tw % th, j = t % tw;
    const float* xn = x + n * h * w * c;
    for (int a = 0; a < kAlpha; ++a) {
      const int64_t r = M * i - 1 + a;
      for (int b = 0; b < kAlpha; ++b) {
        const int64_t q = M * j - 1 + b;
        p[a * kAlpha + b] = (r < 0 || r >= h || q < 0 || q >= w) ? zeros : xn + (r * w + q) * c;
      }
    }
  }
  // The M x M output pixels of tile t in y (C channels each); those past the image's last
  // row or column are outside + e * outside_stride instead.
  template <class P>
  void outputs(P y, int64_t c, int64_t t, P outside, int64_t outside_stride, P o[Tile<M>::kOut]) const {
    const int64_t n = t / (th * tw), i = t / tw % th, j = t % tw;
    for (int a = 0; a < M; ++a)
      for (int b = 0; b < M; ++b) {
        const int64_t r = M * i + a, q = M * j + b;
        o[a * M + b] = (r < h && q < w) ? y + ((n * h + r) * w + q) * c : outside + (a * M + b) * outside_stride;
      }
  }
};

// The transforms of F(2x2, 3x3) and F(4x4, 3x3), as Lavin and Gray give them:
//   input   B^T d B      output   A^T m A      output gradient   A dy A^T
//   kernel  G g G^T      kernel gradient       G^T u G
// Each 1-D transform of a tile maps In vectors z[i] of c channels to Out vectors o[j], in one
// loop over the channels that the compiler vectorises; transform_2d applies it to the columns
// of a tile and then to the rows of the result. The kernels' transforms map single values.
template <int M>
struct Transforms;

template <>
struct Transforms<2> {  // the tiles' own transforms are transform_inputs<2> etc. below
  static void kernel(const float* z, float* o) {  // G: 3 -> 4, one value each
    o[0] = z[0];
    o[1] = 0.5f * (z[0] + z[1] + z[2]);
    o[2] = 0.5f * (z[0] - z[1] + z[2]);
    o[3] = z[2];
  }
  static void kernel_grad(const float* z, float* o) {  // G^T: 4 -> 3
    o[0] = z[0] + 0.5f * (z[1] + z[2]);
    o[1] = 0.5f * (z[1] - z[2]);
    o[2] = 0.5f * (z[1] + z[2]) + z[3];
  }
};

template <>
struct Transforms<4> {
  static void input(const float* const* z, float* const* o, int64_t c) {  // B^T: 6 -> 6
    const float *__restrict z0 = z[0], *__restrict z1 = z[1], *__restrict z2 = z[2], *__restrict z3 = z[3],
                *__restrict z4 = z[4], *__restrict z5 = z[5];
    float *__restrict o0 = o[0], *__restrict o1 = o[1], *__restrict o2 = o[2], *__restrict o3 = o[3],
          *__restrict o4 = o[4], *__restrict o5 = o[5];
#pragma omp simd
    for (int64_t k = 0; k < c; ++k) {
      o0[k] = 4.0f * z0[k] - 5.0f * z2[k] + z4[k];
      o1[k] = (z3[k] + z4[k]) - 4.0f * (z1[k] + z2[k]);
      o2[k] = (z4[k] - z3[k]) + 4.0f * (z1[k] - z2[k]);
      o3[k] = (z4[k] - z2[k]) + 2.0f * (z3[k] - z1[k]);
      o4[k] = (z4[k] - z2[k]) - 2.0f * (z3[k] - z1[k]);
      o5[k] = 4.0f * z1[k] - 5.0f * z3[k] + z5[k];
    }
  }
  static void output(const float* const* z, float* const* o, int64_t c) {  // A^T: 6 -> 4
    const float *__restrict z0 = z[0], *__restrict z1 = z[1], *__restrict z2 = z[2], *__restrict z3 = z[3],
                *__restrict z4 = z[4], *__restrict z5 = z[5];
    float *__restrict o0 = o[0], *__restrict o1 = o[1], *__restrict o2 = o[2], *__restrict o3 = o[3];
#pragma omp simd
    for (int64_t k = 0; k < c; ++k) {
      const float p12 = z1[k] + z2[k], m12 = z1[k] - z2[k], p34 = z3[k] + z4[k], m34 = z3[k] - z4[k];
      o0[k] = z0[k] + p12 + p34;
      o1[k] = m12 + 2.0f * m34;
      o2[k] = p12 + 4.0f * p34;
      o3[k] = m12 + 8.0f * m34 + z5[k];
    }
  }
  static void output_grad(const float* const* z, float* const* o, int64_t c) {  // A: 4 -> 6
    const float *__restrict z0 = z[0], *__restrict z1 = z[1], *__restrict z2 = z[2], *__restrict z3 = z[3];
    float *__restrict o0 = o[0], *__restrict o1 = o[1], *__restrict o2 = o[2], *__restrict o3 = o[3],
          *__restrict o4 = o[4], *__restrict o5 = o[5];
#pragma omp simd
    for (int64_t k = 0; k < c; ++k) {
      const float p02 = z0[k] + z2[k], p13 = z1[k] + z3[k], q02 = z0[k] + 4.0f * z2[k], q13 = z1[k] + 4.0f * z3[k];
      o0[k] = z0[k];
      o1[k] = p02 + p13;
      o2[k] = p02 - p13;
      o3[k] = q02 + 2.0f * q13;
      o4[k] = q02 - 2.0f * q13;
      o5[k] = z3[k];
    }
  }
  static void kernel(const float* z, float* o) {  // G: 3 -> 6
    o[0] = z[0] / 4.0f;
    o[1] = -(z[0] + z[1] + z[2]) / 6.0f;
    o[2] = -(z[0] - z[1] + z[2]) / 6.0f;
    o[3] = z[0] / 24.0f + z[1] / 12.0f + z[2] / 6.0f;
    o[4] = z[0] / 24.0f - z[1] / 12.0f + z[2] / 6.0f;
    o[5] = z[2];
  }
  static void kernel_grad(const float* z, float* o) {  // G^T: 6 -> 3
    o[0] = z[0] / 4.0f - (z[1] + z[2]) / 6.0f + (z[3] + z[4]) / 24.0f;
    o[1] = (z[2] - z[1]) / 6.0f + (z[3] - z[4]) / 12.0f;
    o[2] = (z[3] + z[4] - z[1] - z[2]) / 6.0f + z[5];
  }
};

using Transform1d = void (*)(const float* const* z, float* const* o, int64_t c);

// X^T z X for one tile of c-channel vectors: z holds In x In pointers (row-major), o Out x Out;
// tmp holds Out x In vectors (F applied down z's columns), which F then maps row by row.
template <int In, int Out, Transform1d F>
void transform_2d(const float* const* z, float* const* o, float* tmp, int64_t c) {
  const float* zs[In];
  float* ts[Out];
  for (int b = 0; b < In; ++b) {  // column b
    for (int i = 0; i < In; ++i) zs[i] = z[i * In + b];
    for (int a = 0; a < Out; ++a) ts[a] = tmp + (a * In + b) * c;
    F(zs, ts, c);
  }
  for (int a = 0; a < Out; ++a) {  // row a
    for (int i = 0; i < In; ++i) zs[i] = tmp + (a * In + i) * c;
    F(zs, o + a * Out, c);
  }
}

// The same for one 3x3 kernel and its Out x Out transform (or back: In x In to 3 x 3).
template <int In, int Out, void (*F)(const float*, float*)>
void transform_2d_kernel(const float* z, float* o) {
  float col[In], t[Out], tmp[Out * In];
  for (int b = 0; b < In; ++b) {
    for (int i = 0; i < In; ++i) col[i] = z[i * In + b];
    F(col, t);
    for (int a = 0; a < Out; ++a) tmp[a * In + b] = t[a];
  }
  for (int a = 0; a < Out; ++a) F(tmp + a * In, o + a * Out);
}

// V[pt][t][c] = (B^T d B)[pt] for tiles t0 .. t0+nt of x (C channels); ld = nt * C.
template <int M>
void transform_inputs(const TileGrid<M>& grid, const float* x, int64_t c, int64_t t0, int64_t nt, const float* zeros,
                      float* tmp, float* v) {
  constexpr int kA = Tile<M>::kAlpha, kP = Tile<M>::kPoints;
  const int64_t ld = nt * c;
  const float* p[kP];
  float* o[kP];
  for (int64_t t = 0; t < nt; ++t) {
    grid.patch(x, c, t0 + t, zeros, p);
    for (int q = 0; q < kP; ++q) o[q] = v + q * ld + t * c;
    transform_2d<kA, kA, Transforms<M>::input>(p, o, tmp, c);
  }
}

// y (M x M per tile, K channels) = A^T m A (+ bias) from M[pt][t][k]; ld = nt * K. Outputs
// past the image's last row or column go to scratch.
template <int M>
void transform_outputs(const TileGrid<M>& grid, const float* m, int64_t kc, int64_t t0, int64_t nt, const float* bias,
                       const float* /*zeros: F(2x2)'s own adds them without a bias*/, float* tmp, float* y) {
  constexpr int kA = Tile<M>::kAlpha, kP = Tile<M>::kPoints, kO = Tile<M>::kOut;
  const int64_t ld = nt * kc;
  float* scratch = tmp + kA * kA * kc;
  const float* e[kP];
  float* out[kO];
  for (int64_t t = 0; t < nt; ++t) {
    grid.outputs(y, kc, t0 + t, scratch, kc, out);
    for (int q = 0; q < kP; ++q) e[q] = m + q * ld + t * kc;
    transform_2d<kA, M, Transforms<M>::output>(e, out, tmp, kc);
    if (bias)
      for (float* o : out) {
#pragma omp simd
        for (int64_t k = 0; k < kc; ++k) o[k] += bias[k];
      }
  }
}

// Z[pt][t][k] = (A dy A^T)[pt] for tiles t0 .. t0+nt of dy (K channels; zero past the edge).
template <int M>
void transform_output_grads(const TileGrid<M>& grid, const float* dy, int64_t kc, int64_t t0, int64_t nt,
                            const float* zeros, float* tmp, float* z) {
  constexpr int kA = Tile<M>::kAlpha, kP = Tile<M>::kPoints, kO = Tile<M>::kOut;
  const int64_t ld = nt * kc;
  const float* in[kO];
  float* o[kP];
  for (int64_t t = 0; t < nt; ++t) {
    grid.outputs(dy, kc, t0 + t, zeros, 0, in);
    for (int q = 0; q < kP; ++q) o[q] = z + q * ld + t * kc;
    transform_2d<M, kA, Transforms<M>::output_grad>(in, o, tmp, kc);
  }
}

// F(2x2, 3x3) has its own transforms, each one loop over the channels that does the whole
// tile in registers: faster than the two passes of transform_2d for the cnn's conv2 (its
// forward took 3.3 to 3.5 ms that way against 3.0), and the same bits as before F(4x4) came.
template <>
void transform_inputs<2>(const TileGrid<2>& grid, const float* __restrict x, int64_t c, int64_t t0, int64_t nt,
                         const float* zeros, float*, float* __restrict v) {
  const int64_t ld = nt * c;
  for (int64_t t = 0; t < nt; ++t) {
    const float* p[16];
    grid.patch(x, c, t0 + t, zeros, p);
    float* __restrict o = v + t * c;
#pragma omp simd
    for (int64_t k = 0; k < c; ++k) {
      float d[16], s[16];
      for (int e = 0; e < 16; ++e) d[e] = p[e][k];
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

template <>
void transform_outputs<2>(const TileGrid<2>& grid, const float* __restrict m, int64_t kc, int64_t t0, int64_t nt,
                          const float* bias, const float* zeros, float* tmp, float* __restrict y) {
  const int64_t ld = nt * kc;
  const float* b = bias ? bias : zeros;
  for (int64_t t = 0; t < nt; ++t) {
    float* out[4];
    grid.outputs(y, kc, t0 + t, tmp, kc, out);
    float* __restrict o0 = out[0];
    float* __restrict o1 = out[1];
    float* __restrict o2 = out[2];
    float* __restrict o3 = out[3];
    const float* mt = m + t * kc;
#pragma omp simd
    for (int64_t k = 0; k < kc; ++k) {
      float e[16], s[8];
      for (int p = 0; p < 16; ++p) e[p] = mt[p * ld + k];
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

template <>
void transform_output_grads<2>(const TileGrid<2>& grid, const float* __restrict dy, int64_t kc, int64_t t0,
                               int64_t nt, const float* zeros, float*, float* __restrict z) {
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

// Scratch per thread for transform_2d (and transform_outputs' edge pixels): floats.
template <int M>
int64_t tile_scratch(int64_t c) {
  return (Tile<M>::kAlpha * Tile<M>::kAlpha + Tile<M>::kOut) * c;
}

template <int M>
class WinogradConv final : public LibraryConv {
  static constexpr int kPoints = Tile<M>::kPoints;

 public:
  explicit WinogradConv(const ConvGeometry& g)
      : n_(g.n), cin_(g.cin), cout_(g.cout), bias_(g.bias), grid_(g.h, g.w),
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
    const int64_t tiles = grid_.tiles(n_), block = tiles_per_block<M>(cin_, cout_);
    const int64_t blocks = (tiles + block - 1) / block;
    const int64_t du_size = kPoints * cin_ * cout_;
    const int64_t buffers = kPoints * block * (cin_ + cout_) + tile_scratch<M>(std::max(cin_, cout_));
    // Summed over a fixed split of the blocks (grouped_sum), so the gradient has the same bits
    // on any number of threads (as oneDNN's direct kernel had).
    const float* du = grouped_sum(
        scratch_, blocks, kWeightGradGroups, buffers, du_size, /*zeroed=*/false,
        [&](int64_t bl, bool first, float* v, float* sum) {
          float* z = v + kPoints * block * cin_;
          float* tmp = z + kPoints * block * cout_;
          const int64_t t0 = bl * block, nt = std::min(block, tiles - t0);
          transform_inputs(grid_, x, cin_, t0, nt, zeros_.data(), tmp, v);
          transform_output_grads(grid_, dy, cout_, t0, nt, zeros_.data(), tmp, z);
          for (int p = 0; p < kPoints; ++p)  // dU[p] (C x K) += V[p]^T Z[p]
            gemm(true, false, cin_, cout_, nt, 1.0f, v + p * nt * cin_, cin_, z + p * nt * cout_, cout_,
                 first ? 0.0f : 1.0f, sum + p * cin_ * cout_, cout_);
        });
    for (int64_t k = 0; k < cout_; ++k)
      for (int64_t c = 0; c < cin_; ++c) {
        float u[kPoints];
        for (int p = 0; p < kPoints; ++p) u[p] = du[(p * cin_ + c) * cout_ + k];
        float g[9];
        transform_2d_kernel<Tile<M>::kAlpha, 3, Transforms<M>::kernel_grad>(u, g);
        for (int e = 0; e < 9; ++e) dw[(k * 9 + e) * cin_ + c] = g[e];
      }
    if (bias_) bias_gradient(dy, n_ * grid_.h * grid_.w, cout_, db);
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
        float u[kPoints];
        transform_2d_kernel<3, Tile<M>::kAlpha, Transforms<M>::kernel>(g, u);
        const int64_t i = flip ? k : c, o = flip ? c : k;
        for (int p = 0; p < kPoints; ++p) u_[(p * in + i) * out + o] = u[p];
      }
  }

  // y = the convolution of x (in channels) with u_ (to out channels), plus bias.
  void run(const float* x, int64_t in, int64_t out, const float* bias, float* y) {
    const int64_t tiles = grid_.tiles(n_), block = tiles_per_block<M>(in, out);
    const int64_t blocks = (tiles + block - 1) / block;
    const int max_parts = static_cast<int>(std::min<int64_t>(blocks, math_threads()));
    const int64_t part_size = kPoints * block * (in + out) + tile_scratch<M>(std::max(in, out));
    scratch_.resize(static_cast<size_t>(max_parts * part_size));
    parallel_rows(blocks, 1, max_parts, [&](int64_t b0, int64_t b1, int part) {
      float* v = scratch_.data() + part * part_size;
      float* m = v + kPoints * block * in;
      float* tmp = m + kPoints * block * out;
      for (int64_t bl = b0; bl < b1; ++bl) {
        const int64_t t0 = bl * block, nt = std::min(block, tiles - t0);
        transform_inputs(grid_, x, in, t0, nt, zeros_.data(), tmp, v);
        for (int p = 0; p < kPoints; ++p)  // M[p] (tiles x out) = V[p] (tiles x in) U[p] (in x out)
          gemm(false, false, nt, out, in, 1.0f, v + p * nt * in, in, u_.data() + p * in * out, out, 0.0f,
               m + p * nt * out, out);
        transform_outputs(grid_, m, out, t0, nt, bias, zeros_.data(), tmp, y);
      }
    });
  }

  int64_t n_, cin_, cout_;
  bool bias_;
  TileGrid<M> grid_;
  std::vector<float> zeros_, u_, scratch_;
};

}  // namespace

// At least 8 channels each way, so the GEMMs have some depth; at most 128 x 128 channel
// pairs, so that one point's transformed kernels (64 KiB) stay in the L2 cache beside a block
// of tiles: every block reads all 16 (F(4x4): 36) of them again, and wider layers would stream them from
// memory once per block.
bool winograd_fits(const ConvGeometry& g) {
  return g.kernel == 3 && g.stride == 1 && g.padding == 1 && g.cin >= 8 && g.cout >= 8 &&
         g.cin * g.cout <= 128 * 128;
}

// F(4x4, 3x3) where it has fewer multiply-adds in its GEMMs (tiles x points) and both sides
// have 64+ channels; else F(2x2, 3x3). F(4x4) needs 36 points for 16 outputs against F(2x2)'s
// 16 for 4, but its tiles hang further over the edges of small images: 14 x 14 takes 16
// tiles of 36 points against 49 of 16 (576 against 784), 16 x 16 takes 576 against 1024, 2 x 2
// 36 against 16. With 32 channels its 36 GEMMs per block are too shallow to gain anything:
// the cnn's conv2 (14 x 14, 32 -> 64 channels) took as long either way, while resnet18's
// 64- and 128-channel layers made its step 10-15% faster (docs/performance.md).
int winograd_tile(const ConvGeometry& g) {
  auto work = [&g](int64_t m) { return ((g.h + m - 1) / m) * ((g.w + m - 1) / m) * (m + 2) * (m + 2); };
  return std::min(g.cin, g.cout) >= 64 && work(4) < work(2) ? 4 : 2;
}

std::unique_ptr<LibraryConv> make_winograd_conv(const ConvGeometry& g, int tile) {
  if (!winograd_fits(g)) return nullptr;
  if (tile == 0) tile = winograd_tile(g);
  HPC_CHECK(tile == 2 || tile == 4, "Winograd tile ", tile, " (2 or 4)");
  if (tile == 4) return std::make_unique<WinogradConv<4>>(g);
  return std::make_unique<WinogradConv<2>>(g);
}

}  // namespace hpc::nn

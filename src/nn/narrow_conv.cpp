// A direct float weight gradient for convolutions with few inputs per output (KH*KW*Cin of at most
// kMaxDepth, a first layer on grey or RGB images): cnn's conv1 is 3x3 over one channel, nine
// multiply-adds per output channel. oneDNN's kernels are built for deep reductions and spend
// most of their time outside the multiply-adds on such a layer (its weight gradient ran at
// about 21 GFLOP/s on AVX2, a fifth of the machine's rate; docs/performance.md), and
// im2col + sgemm is no faster, since the columns are as large as the output.
//
// Work goes by rows of output pixels. For each, the KH input rows under it are copied into a
// band with the padding's zeros written out, so that input value e = (kh, kw, c) of output
// pixel ow sits at band[offset[e] + ow * stride * Cin] and no pixel needs a bounds check or
// a gather. Then
//   weight gradient  dwt[e][k] += sum_p x_e(p) * dy[p][k]
// in register blocks of weights by output channels, which the compiler keeps in vector
// registers (below). The forward pass and the input gradient are left to oneDNN, or to
// im2col without it: a forward pass written the same way was slower than oneDNN's jit:avx2
// kernel (0.7 against 0.36 ms for conv1), and a first layer needs no input gradient.
//
// Every output value is computed by one thread; the weight gradient is summed over a fixed
// split of the chunks into groups, so results have the same bits on any number of threads.
#include <algorithm>
#include <cstring>
#include <vector>

#include "nn/library_conv.hpp"
#include "nn/parallel.hpp"

namespace hpc::nn {
namespace {

constexpr int64_t kMaxDepth = 32;  // inputs per output, bias included
// The register block: kRows weights by kLanes output channels, kSplit times (pixels taken
// in turn), sized for the vector registers of the ISA compiled for so that it keeps 8 to 12
// independent sums, enough to cover the latency of the multiply-adds: 16 registers of 8
// floats on AVX2 (narrower ISAs split them), 32 of 16 on AVX-512.
#if defined(__AVX512F__)
constexpr int64_t kRows = 3, kSplit = 2;  // 12 registers
#else
constexpr int64_t kRows = 2, kSplit = 1;  // 8 registers
#endif
constexpr int64_t kLanes = 32;
constexpr int64_t kBandRows = 4;          // output rows per weight-gradient chunk
constexpr int64_t kWeightGradGroups = 8;  // the weight gradient's partial sums

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

class NarrowConv final : public LibraryConv {
 public:
  NarrowConv(const ConvGeometry& g, std::unique_ptr<LibraryConv> data)
      : g_(g), ho_((g.h + 2 * g.padding - g.kernel) / g.stride + 1),
        wo_((g.w + 2 * g.padding - g.kernel) / g.stride + 1), depth_(g.kernel * g.kernel * g.cin),
        depthp_(round_up(depth_, kRows)), coutp_(round_up(g.cout, kLanes)), data_(std::move(data)) {
    // A band row is an input row with its padding.
    row_len_ = (g.w + 2 * g.padding) * g.cin;
    // The band's last row stays zero: the weight gradient's padding entries (e >= depth_) read it.
    band_len_ = (g.kernel + 1) * row_len_;
    for (int64_t kh = 0; kh < g.kernel; ++kh)
      for (int64_t kw = 0; kw < g.kernel; ++kw)
        for (int64_t c = 0; c < g.cin; ++c) offset_.push_back(kh * row_len_ + kw * g.cin + c);
    offset_.resize(static_cast<size_t>(depthp_), g.kernel * row_len_);
  }

  bool forward(const float* x, const float* w, const float* b, float* y) override {
    return data_ && data_->forward(x, w, b, y);
  }

  bool backward_data(const float* dy, const float* w, float* dx) override {
    return data_ && data_->backward_data(dy, w, dx);
  }

  bool backward_weights(const float* x, const float* dy, float* dw, float* db) override {
    const int64_t rows = g_.n * ho_, chunks = (rows + kBandRows - 1) / kBandRows;
    // Per group: depthp_ rows of weight gradients, then the bias gradient.
    const int64_t sum_size = (depthp_ + 1) * coutp_;
    const int64_t part_size = kBandRows * band_len_ + kBandRows * wo_ * coutp_;
    // Zeroed: the bands' padding and the sums start at zero.
    const float* sums = grouped_sum(
        scratch_, chunks, kWeightGradGroups, part_size, sum_size, /*zeroed=*/true,
        [&](int64_t c, bool /*first*/, float* bands, float* dwt) {
          float* padded = bands + kBandRows * band_len_;  // dy with channels past cout zeroed
          const int64_t r0 = c * kBandRows, nr = std::min(kBandRows, rows - r0), np = nr * wo_;
          for (int64_t i = 0; i < nr; ++i) fill_band(x, r0 + i, bands + i * band_len_);
          const float* g = dy + r0 * wo_ * g_.cout;
          if (g_.cout != coutp_) {
            for (int64_t p = 0; p < np; ++p) std::memcpy(padded + p * coutp_, g + p * g_.cout, sizeof(float) * g_.cout);
            g = padded;
          }
          for (int64_t e0 = 0; e0 < depthp_; e0 += kRows)
            for (int64_t k0 = 0; k0 < coutp_; k0 += kLanes)
              weight_grad_block(bands, nr, e0, g + k0, dwt + e0 * coutp_ + k0);
          if (g_.bias)
            for (int64_t k0 = 0; k0 < coutp_; k0 += kLanes) bias_grad_block(g + k0, np, dwt + depthp_ * coutp_ + k0);
        });
    for (int64_t k = 0; k < g_.cout; ++k) {
      for (int64_t e = 0; e < depth_; ++e) dw[k * depth_ + e] = sums[e * coutp_ + k];
      if (g_.bias) db[k] = sums[depthp_ * coutp_ + k];
    }
    return true;
  }

 private:
  // The KH padded input rows under output row r (sample r / ho, row r % ho); zeros where
  // they fall outside the image. The band's last row and each row's end stay zero.
  void fill_band(const float* x, int64_t r, float* __restrict band) const {
    const int64_t n = r / ho_, oh = r % ho_, cin = g_.cin, lead = g_.padding * cin, len = g_.w * cin;
    for (int64_t kh = 0; kh < g_.kernel; ++kh) {
      float* __restrict row = band + kh * row_len_;
      const int64_t ih = oh * g_.stride - g_.padding + kh;
      if (ih < 0 || ih >= g_.h) {
        std::fill(row, row + lead + len, 0.0f);
      } else {
        std::fill(row, row + lead, 0.0f);
        std::memcpy(row + lead, x + ((n * g_.h + ih) * g_.w) * cin, sizeof(float) * len);
      }
    }
  }

  // dwt[j][l] += sum over the pixels of nr band rows of x_{e0+j}(p) * g[p][l], for kRows
  // weights and kLanes channels (rows of dwt and g are coutp_ apart). With kSplit = 2, even
  // and odd pixels are summed apart and added at the end.
  void weight_grad_block(const float* bands, int64_t nr, int64_t e0, const float* __restrict g,
                         float* __restrict dwt) const {
    float acc[kSplit][kRows][kLanes] = {};
    const int64_t step = g_.stride * g_.cin;
    for (int64_t i = 0; i < nr; ++i) {
      const float* band = bands + i * band_len_;
      const float* __restrict gi = g + i * wo_ * coutp_;
      // One pixel into the sums acc[s].
      auto add = [&](int64_t ow, int64_t s) {
        const float* __restrict gr = gi + ow * coutp_;
        float v[kRows];
        for (int64_t j = 0; j < kRows; ++j) v[j] = band[offset_[e0 + j] + ow * step];
#pragma omp simd
        for (int64_t l = 0; l < kLanes; ++l)
          for (int64_t j = 0; j < kRows; ++j) acc[s][j][l] += v[j] * gr[l];
      };
      int64_t ow = 0;
      for (; ow + kSplit <= wo_; ow += kSplit)
        for (int64_t s = 0; s < kSplit; ++s) add(ow + s, s);
      for (; ow < wo_; ++ow) add(ow, 0);
    }
    for (int64_t j = 0; j < kRows; ++j)
      for (int64_t l = 0; l < kLanes; ++l) {
        float sum = acc[0][j][l];
        for (int64_t s = 1; s < kSplit; ++s) sum += acc[s][j][l];
        dwt[j * coutp_ + l] += sum;
      }
  }

  // db[l] += sum over np pixels of g[p][l], for kLanes channels (rows of g are coutp_ apart).
  void bias_grad_block(const float* __restrict g, int64_t np, float* __restrict db) const {
    float acc[kLanes] = {};
    for (int64_t p = 0; p < np; ++p)
#pragma omp simd
      for (int64_t l = 0; l < kLanes; ++l) acc[l] += g[p * coutp_ + l];
    for (int64_t l = 0; l < kLanes; ++l) db[l] += acc[l];
  }

  ConvGeometry g_;
  int64_t ho_, wo_, depth_, depthp_, coutp_, row_len_ = 0, band_len_ = 0;
  std::vector<int64_t> offset_;  // of input value e = (kh, kw, c) in a band, for pixel 0
  std::unique_ptr<LibraryConv> data_;  // forward and input gradient, where the library has them
  std::vector<float> scratch_;
};

}  // namespace

bool narrow_fits(const ConvGeometry& g) {
  return g.kernel > 1 && g.kernel * g.kernel * g.cin + (g.bias ? 1 : 0) <= kMaxDepth;
}

std::unique_ptr<LibraryConv> make_narrow_conv(const ConvGeometry& g) {
  return narrow_fits(g) ? std::make_unique<NarrowConv>(g, make_library_conv(g)) : nullptr;
}

}  // namespace hpc::nn

// A float convolution computed by a vendor library instead of im2col + GEMM. On the CPU that
// is oneDNN's JIT convolutions, which skip the im2col copies and beat im2col + sgemm on our
// shapes (bench/layer_profile; numbers in docs/performance.md). CMake compiles
// library_conv_dnnl.cpp or library_conv_none.cpp. Where one of our own convolutions fits
// (Winograd or narrow, below), Conv2d takes it instead, in every build; it falls back to its own im2col path (the
// reference, and the only path for double) for whatever neither serves.
#pragma once

#include <cstdint>
#include <memory>

namespace hpc::nn {

struct ConvGeometry {
  int64_t n, h, w, cin, cout, kernel, stride, padding;
  bool bias;
};

class LibraryConv {
 public:
  virtual ~LibraryConv() = default;
  // All tensors are NHWC; weights are Cout x KH x KW x Cin. Each call returns false when the
  // library has no fast kernel for that direction, and the caller computes it itself.
  virtual bool forward(const float* x, const float* w, const float* b, float* y) = 0;
  virtual bool backward_data(const float* dy, const float* w, float* dx) = 0;
  // Overwrites dw (and db when the convolution has a bias).
  virtual bool backward_weights(const float* x, const float* dy, float* dw, float* db) = 0;
};

// nullptr when this build has no library convolution or the library rejects the geometry.
std::unique_ptr<LibraryConv> make_library_conv(const ConvGeometry& g);
const char* library_conv_name();
// As gemm_kernels() (nn/gemm.hpp), for the library convolution; "" without one.
std::string library_conv_kernels();

// Our own Winograd convolution (winograd.cpp), F(2x2, 3x3) or F(4x4, 3x3), in every build: 3x3
// kernels with stride 1 and padding 1, at least 8 channels in and out and at most 128 x 128
// channel pairs (winograd.cpp says why). Against a direct kernel F(2x2) does 2.25x fewer
// multiply-adds and F(4x4) 4x fewer (less where its 4x4 tiles hang over the image's edge);
// the rounding differs from a direct kernel's by about 1e-6 and 5e-6 relative. On AVX2, where
// oneDNN has no Winograd kernel, it is the faster of the two.
bool winograd_fits(const ConvGeometry& g);
// 4 where F(4x4) does fewer multiply-adds than F(2x2) for this image size and both sides have
// 64+ channels, else 2 (winograd.cpp says why); what tile 0 below takes.
int winograd_tile(const ConvGeometry& g);
// nullptr: does not fit. tile: 2 or 4, or 0 for winograd_tile(g).
std::unique_ptr<LibraryConv> make_winograd_conv(const ConvGeometry& g, int tile = 0);

// Our own direct convolution for layers with at most 32 inputs per output (KH*KW*Cin, plus
// one for a bias) and a kernel larger than 1x1 (narrow_conv.cpp), in every build: the first
// layer on grey or RGB images, where oneDNN's weight-gradient kernels are slow. It computes
// the weight gradient and passes the forward pass and the input gradient to
// make_library_conv's convolution (none: Conv2d's im2col).
bool narrow_fits(const ConvGeometry& g);
std::unique_ptr<LibraryConv> make_narrow_conv(const ConvGeometry& g);  // nullptr: does not fit

}  // namespace hpc::nn

// The GPU decoder's random resized crop, flip and normalisation (kernels.hpp): one thread per
// output pixel, the CPU's data::resample arithmetic (double, pixel centres aligned, rounded to a
// byte) and then the CPU assembler's table. No sums: every output is computed on its own, so the
// result does not depend on the launch shape.
#include "core/cuda_check.hpp"
#include "kernels/kernels.hpp"
#include "kernels/launch.cuh"

namespace hpc::kernels {
namespace {

__device__ double clamp_to(double v, double hi) { return v < 0.0 ? 0.0 : (v > hi ? hi : v); }

__global__ void resized_crop_normalize_kernel(const ResizedCrop* crops, int64_t pixels, int64_t size, float* out,
                                              const float* table) {
  HPC_GRID_STRIDE(p, pixels) {
    const int64_t ox = p % size, oy = (p / size) % size, image = p / (size * size);
    const ResizedCrop r = crops[image];
    const double sy = r.h / static_cast<double>(size), sx = r.w / static_cast<double>(size);
    const double fy = clamp_to(r.y0 + (static_cast<double>(oy) + 0.5) * sy - 0.5, static_cast<double>(r.height - 1));
    const int64_t src_x = r.flip ? size - 1 - ox : ox;
    const double fx = clamp_to(r.x0 + (static_cast<double>(src_x) + 0.5) * sx - 0.5, static_cast<double>(r.width - 1));
    const auto y0 = static_cast<int64_t>(fy), x0 = static_cast<int64_t>(fx);
    const int64_t y1 = y0 + 1 < r.height ? y0 + 1 : y0, x1 = x0 + 1 < r.width ? x0 + 1 : x0;
    const double wy = fy - static_cast<double>(y0), wx = fx - static_cast<double>(x0);
    const uint8_t* row0 = r.image + y0 * r.pitch;
    const uint8_t* row1 = r.image + y1 * r.pitch;
    float* q = out + p * 3;
    for (int c = 0; c < 3; ++c) {
      const double v = (1 - wy) * ((1 - wx) * row0[x0 * 3 + c] + wx * row0[x1 * 3 + c]) +
                       wy * ((1 - wx) * row1[x0 * 3 + c] + wx * row1[x1 * 3 + c]);
      const auto byte = static_cast<int>(clamp_to(v + 0.5, 255.0));
      q[c] = table[c * 256 + byte];
    }
  }
}

}  // namespace

void resized_crop_normalize(const ResizedCrop* crops, int64_t n, int64_t size, float* out, const float* table,
                            cudaStream_t stream) {
  const int64_t pixels = n * size * size;
  if (pixels == 0) return;
  resized_crop_normalize_kernel<<<blocks_for(pixels), kThreads, 0, stream>>>(crops, pixels, size, out, table);
  CUDA_CHECK_LAUNCH();
}

}  // namespace hpc::kernels

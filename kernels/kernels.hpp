// Host wrappers of hpctrain's own CUDA kernels: the work that neither cuDNN nor cuBLAS does.
// Every wrapper takes device pointers, enqueues on `stream` and checks the launch
// (CUDA_CHECK_LAUNCH); none synchronises. Each kernel has a CPU counterpart it is tested
// against (tests/gpu/, DESIGN.md principle 3), named in its comment.
//
// Compiled only when CMake finds the CUDA toolkit (kernels/CMakeLists.txt), for sm_80 and
// sm_90 plus PTX.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.hpp"
#include "kernels/index_walk.hpp"

namespace hpc::kernels {

// ---- elementwise (nn::ReLU, nn::Residual, data::BatchAssembler) ------------------------------

// y = max(x, 0).
void relu_forward(const float* x, float* y, int64_t n, cudaStream_t stream);
// dx = dy where y > 0, else 0 (y: the forward's output, as the CPU layer keeps it).
void relu_backward(const float* y, const float* dy, float* dx, int64_t n, cudaStream_t stream);
// out = a + b (a residual block's join; out may alias a or b).
void add(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream);
// Images of bytes (NHWC, `channels` innermost) to normalised floats through a lookup table of
// channels x 256 floats, the table the CPU assembler uses: out[i] = table[c(i) * 256 + in[i]],
// bit for bit the CPU's values.
void normalize_u8(const uint8_t* in, float* out, int64_t n, int channels, const float* table,
                  cudaStream_t stream);
// The same for n images of h x w x c bytes that are still to be cropped and flipped (GPU
// augmentation): crops holds three int32 per image, (dy, dx, flip), and output pixel (y, x) is
// input pixel (y + dy, (flip ? w - 1 - x : x) + dx), a black (0) byte where that is outside
// the image, as data::BatchAssembler does on the host.
void crop_flip_normalize_u8(const uint8_t* in, const int32_t* crops, float* out, int64_t n, int64_t h, int64_t w,
                            int channels, const float* table, cudaStream_t stream);

// The same on activations of any precision (t: F32, BF16 or F16; x, y, ... of that type),
// computed in float and rounded once when stored: the layers of mixed-precision training.
void relu_forward(DType t, const void* x, void* y, int64_t n, cudaStream_t stream);
void relu_backward(DType t, const void* y, const void* dy, void* dx, int64_t n, cudaStream_t stream);
void add(DType t, const void* a, const void* b, void* out, int64_t n, cudaStream_t stream);

// out = in * factor, converted from `from` to `to` (each F32, BF16 or F16; in == out only when
// the types are equal): fp32 weights to their bf16/fp16 copies, low-precision gradients to the
// fp32 arena with the loss scale divided out, logits to fp32. When non_finite is not null it
// is set to 1 if any result is not finite (and never cleared: zero it per step).
void convert(DType from, const void* in, DType to, void* out, int64_t n, float factor, int* non_finite,
             cudaStream_t stream);

// The same conversion, to fp32, of several spans of one arena into another of the same layout:
// out[s.offset + i] = in[s.offset + i] * factor for every span s and 0 <= i < s.count, in one
// launch for every kMaxConvertSpans spans (the same arithmetic as convert, so the same bits).
// Mixed precision's convolution weight gradients reach the fp32 arena this way, all of a step's
// (or of a bucket's) at once, not one launch a layer (nn::cuda::DeviceArenas::land_grads).
void convert_spans(DType from, const void* in, float* out, const std::vector<Span>& spans, float factor,
                   cudaStream_t stream);

// ---- loss (nn::SoftmaxCrossEntropy: forward and backward fused) -------------------------------

// For logits of n rows x k classes and int32 labels: the softmax probabilities, the gradient
// of the mean loss with respect to the logits ((p - target) / n with target = (1 - s) onehot +
// s / k), and each row's loss. A label outside [0, k) gives that row a NaN loss and a zero
// gradient. One warp per row; reductions in a fixed order, so results are deterministic.
void softmax_xent(const float* logits, const int32_t* labels, int64_t n, int64_t k, float smoothing,
                  float* probabilities, float* dlogits, float* row_loss, cudaStream_t stream);

// *out = sum of x[0..n) in double, in a fixed order (one block): the step's loss without a
// non-deterministic atomic.
void sum_deterministic(const float* x, int64_t n, double* out, cudaStream_t stream);

// *correct += the rows of scores (n x k) whose first largest entry is at the row's label (the
// trainer's accuracy count). *correct is only ever added to: zero it first.
void count_correct(const float* scores, const int32_t* labels, int64_t n, int64_t k, int* correct,
                   cudaStream_t stream);

// ---- optimizer (optim::Sgd::step) ---------------------------------------------------------------

// The SGD update of the whole parameter arena in one launch: for the parameters of range r
// (elements [range_end[r-1], range_end[r]), weight decay range_decay[r]),
//   g' = g + wd p;  v = mu v + g';  p -= lr (nesterov ? g' + mu v : v)
// each a * b + c rounded once (fused multiply-add) when `fused`, else twice: pass
// optim::sgd_fuses_multiply_add(), and one step matches the CPU's optim::Sgd bit for bit.
// range_end and range_decay are device arrays of `ranges` entries, range_end ascending with
// the last equal to n.
// When skip is not null and *skip is non-zero on the device, the launch changes nothing: an
// fp16 step whose gradients overflowed is skipped without the host waiting for the flag.
// When hyper is not null, lr and momentum are read from the device (hyper[0], hyper[1]) instead:
// a step captured in a CUDA graph takes each replay's values from there.
void sgd_step(float* params, const float* grads, float* velocity, int64_t n, const int64_t* range_end,
              const float* range_decay, int ranges, float lr, float momentum, bool nesterov, bool fused,
              cudaStream_t stream, const int* skip = nullptr, const float* hyper = nullptr);

// ---- batch norm in training (nn::BatchNorm; NHWC: `channels` innermost, rows = N*H*W) --------

// Per-channel sums are taken in double over fixed slabs of rows and the slabs added in a fixed
// order: deterministic, the same bits on every run. x, y, dy, dx and residual are of type t
// (F32, BF16 or F16), computed in float; the per-channel vectors are fp32. `work` is device
// scratch of batch_norm_work_bytes(t, rows, channels) bytes, used by one layer: the forward
// keeps its coefficients there for the backward of the same step. It must be zero when first
// used for a channel count (device Tensors are zeroed when allocated): the fused finalize's
// counters at its start are, and every call leaves them at zero again, so a CUDA graph replays
// the calls as they are, whatever channel counts they have. A counter at or past its count when
// a launch starts traps it; one below it, which no completed launch leaves, would go unseen.
size_t batch_norm_work_bytes(DType t, int64_t rows, int64_t channels);
// The batch's mean and 1 / sqrt(biased variance + eps) into save_mean and save_invstd;
// running = (1 - momentum) running + momentum batch, the variance unbiased (as cuDNN, PyTorch
// and the CPU layer); y = (x - mean) invstd gamma + beta; when residual is not null, y rounded
// to t plus residual (a residual block's join, fused: nn::Residual adds after the branch's
// last batch norm); then max(y, 0) when relu. Each step rounds as the separate passes would.
void batch_norm_forward_train(DType t, const void* x, void* y, int64_t rows, int64_t channels, const float* gamma,
                              const float* beta, float* running_mean, float* running_var, double momentum,
                              double eps, bool relu, float* save_mean, float* save_invstd, void* work,
                              cudaStream_t stream, const void* residual = nullptr);
// From dy, the gradient of the normalised output, and the forward's save_mean and save_invstd:
// dgamma = param_factor sum g xhat and dbeta = param_factor sum g (both overwritten),
// dx = gamma invstd (g - mean(g) - xhat mean(g xhat)) with xhat = (x - mean) invstd, where
// g = dy, or, when relu, dy where the forward's fused ReLU (no residual) let its value through:
// the mask is recomputed from x with the forward's coefficients in `work`, bit for bit the one
// its stored output gives, so no pass reads y. Call after the forward of the same step, with
// the same work area.
void batch_norm_backward(DType t, const void* x, const void* dy, void* dx, int64_t rows, int64_t channels,
                         const float* gamma, const float* save_mean, const float* save_invstd, float param_factor,
                         float* dgamma, float* dbeta, void* work, cudaStream_t stream, bool relu = false);

// How the batch-norm passes are launched. gpu_step --kernel-shapes times every choice on
// ResNet-50's shapes and kernels_test checks each; the defaults are the fastest on an H200
// (2026-11-28: 8.97 ms for ResNet-50's 53 batch norms at batch 128, bf16, forward and
// backward; 17.3 ms with the former 16,2,4,0). A process-wide setting: the trainer keeps the
// defaults unless HPCTRAIN_BN_TUNING says otherwise. The sums' slabs follow pack_bytes, so a
// choice has its own bits (the same on every run of it); fused_finalize changes no bit.
struct BatchNormTuning {
  int pack_bytes = 8;    // bytes of neighbouring channels one thread loads at once: 16 or 8
  int blocks_per_sm = 4; // the occupancy the passes are compiled for: 2 (up to 128 registers a thread) or 4 (64)
  int rows = 2;          // rows a thread of the sums and apply passes loads before it computes: 4 or 2
  bool one_wave = true;  // apply passes: as many blocks as the GPU runs at once, each looping over its rows
  int sum_blocks = 1024; // blocks of the sums pass (slabs x channel blocks): 1024, 512 or 256; fewer slabs
                         // leave the finalize fewer partial sums to add
  bool fused_finalize = false;  // the sums pass's last blocks finish the channels (no finalize launch),
                                // adding the same sums in the same order: the same bits. Untimed yet
};
// Throws a usage error for a value other than those.
void set_batch_norm_tuning(const BatchNormTuning& tuning);
BatchNormTuning batch_norm_tuning();
// "8,4,2,1,1024": pack_bytes,blocks_per_sm,rows,one_wave,sum_blocks, and ",1" after them when
// fused_finalize (the unfused choices keep the names they had), as parse_batch_norm_tuning reads
// it back; it also takes the first four alone (sum_blocks then the default) and a sixth field of
// 0 or 1 (fused_finalize).
std::string batch_norm_tuning_text(const BatchNormTuning& tuning);
BatchNormTuning parse_batch_norm_tuning(const std::string& text);
// Every choice (96), the default first, each fused one after its unfused twin.
std::vector<BatchNormTuning> batch_norm_tunings();

// ---- max pooling (nn::MaxPool2d and batch norm's fused pool; NHWC) ----------------------------

// dx (n x h x w x channels) of a max pool of kernel x kernel windows at `stride`, padded by
// `padding` cells a side (0 <= padding <= kernel / 2) that never win: window (oh, ow) covers
// input rows oh*stride - padding .. oh*stride - padding + kernel - 1 and the same columns, and
// there are (h + 2 padding - kernel) / stride + 1 windows down and as many across from w. x is
// the forward's input, dy the gradient of its output (n x ho x wo x channels), both of type t
// (F32, BF16 or F16). Each window's winner is found again from x by the CPU layer's rule (the
// first maximum of the window's cells inside the image in row-major order, strict >); dx is dy
// at a window's winner, the sum in float of those dy where windows overlap (kernel > stride) or
// are padded, +0 where a cell won none: nn::MaxPool2d's backward bit for bit, deterministic (no
// atomics).
void max_pool_backward(DType t, const void* x, const void* dy, void* dx, int64_t n, int64_t h, int64_t w,
                       int64_t channels, int kernel, int stride, int padding, cudaStream_t stream);

// ---- bias gradients (nn::Conv2d, nn::Linear; channels last: `channels` innermost) -------------

// out[c] = factor * the sum over rows of x[r][c] (x: rows x channels of type t, F32, BF16 or
// F16; out: fp32, overwritten; factor: the loss scale divided out). Summed in double over
// fixed slabs of rows, the slabs added in a fixed order: deterministic. `work` is device
// scratch of channel_sums_work_bytes(rows, channels) bytes, used by one call at a time.
size_t channel_sums_work_bytes(int64_t rows, int64_t channels);
void channel_sums(DType t, const void* x, int64_t rows, int64_t channels, float factor, float* out, void* work,
                  cudaStream_t stream);

// ---- images decoded on the GPU (--jpeg-decode gpu) ----------------------------------------------

// One decoded image of a batch and the view of it the model is given (data::View, in source
// pixels: rows y0 .. y0 + h, columns x0 .. x0 + w, mirrored when flip). `image`: device memory,
// height x width interleaved RGB bytes, rows `pitch` bytes apart.
struct ResizedCrop {
  const uint8_t* image;
  int64_t pitch;
  int32_t height, width;
  double y0, x0, h, w;
  int32_t flip;
};
// out (n x size x size x 3 floats, NHWC): each image's view bilinear-resampled to size x size with
// the CPU's geometry (data::resample: pixel centres aligned, rounded to a byte), then normalised
// through `table` (3 x 256 floats, the CPU assembler's). crops: n of them, in device memory. The
// resampling is computed in double as on the CPU; the CPU may contract to fused multiply-adds
// differently, so a byte may differ by one where a value lies on a rounding boundary.
void resized_crop_normalize(const ResizedCrop* crops, int64_t n, int64_t size, float* out, const float* table,
                            cudaStream_t stream);

// ---- mixed precision ----------------------------------------------------------------------------

// x *= factor, and *non_finite = 1 if any result is not finite (a loss-scaled fp16 step that
// overflowed is skipped). *non_finite is only ever set, never cleared: zero it per step.
void scale_and_check(float* x, int64_t n, float factor, int* non_finite, cudaStream_t stream);

}  // namespace hpc::kernels

#include "core/cuda_check.hpp"
#include "core/error.hpp"
#include "kernels/kernels.hpp"
#include "kernels/launch.cuh"
#include "kernels/types.cuh"

namespace hpc::kernels {
namespace {

// The elementwise operations, on V neighbouring values at a time (16-byte loads and stores
// where the count and the pointers allow: pack_width), each computed in float and rounded once.
struct ReluForward {
  __device__ float operator()(float x, float) const { return x > 0.f ? x : 0.f; }
};
struct ReluBackward {  // (y, dy): dy where the forward's output y > 0
  __device__ float operator()(float y, float dy) const { return y > 0.f ? dy : 0.f; }
};
struct Add {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// out[i] = op(a[i], b[i]) (b may be null for a unary op); out may alias a or b.
template <class T, int V, class Op>
__global__ void map_kernel(const T* a, const T* b, T* out, int64_t packs, Op op) {
  HPC_GRID_STRIDE(i, packs) {
    const Pack<T, V> av = reinterpret_cast<const Pack<T, V>*>(a)[i];
    Pack<T, V> bv = av;
    if (b) bv = reinterpret_cast<const Pack<T, V>*>(b)[i];
    Pack<T, V> o;
#pragma unroll
    for (int j = 0; j < V; ++j) o.v[j] = from_f<T>(op(to_f(av.v[j]), to_f(bv.v[j])));
    reinterpret_cast<Pack<T, V>*>(out)[i] = o;
  }
}

template <class Op>
void map(DType t, const void* a, const void* b, void* out, int64_t n, Op op, cudaStream_t stream) {
  if (n == 0) return;
  with_type(t, [&](auto tag) {
    using T = decltype(tag);
    with_width<T>(pack_width<T>(n, {a, b, out}), [&](auto width) {
      constexpr int V = decltype(width)::value;
      map_kernel<T, V, Op><<<blocks_for(n / V), kThreads, 0, stream>>>(
          static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), n / V, op);
    });
  });
  CUDA_CHECK_LAUNCH();
}

// V neighbouring values a thread: V = 4 moves 16 bytes of fp32 (and 8 of a 16-bit type) in one
// access each way where the count and the pointers allow (pack_width), else 1.
template <class From, class To, int V>
__global__ void convert_kernel(const From* in, To* out, int64_t packs, float factor, int* non_finite) {
  using In = Pack<From, V>;
  using Out = Pack<To, V>;
  bool bad = false;
  HPC_GRID_STRIDE(k, packs) {
    const In a = reinterpret_cast<const In*>(in)[k];
    Out b;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      b.v[j] = from_f<To>(to_f(a.v[j]) * factor);
      bad |= !isfinite(to_f(b.v[j]));
    }
    reinterpret_cast<Out*>(out)[k] = b;
  }
  if (non_finite && __syncthreads_or(bad) && threadIdx.x == 0) *non_finite = 1;  // every writer writes 1
}

// One list's run of elements (index_walk.hpp), a thread's elements in order.
template <class From>
__global__ void convert_spans_kernel(const From* in, float* out, SpanList spans, float factor) {
  int r = 0;
  HPC_GRID_STRIDE(i, spans.total) {
    const int64_t k = span_element(spans, r, i);
    out[k] = from_f<float>(to_f(in[k]) * factor);
  }
}

__global__ void normalize_u8_kernel(const uint8_t* in, float* out, int64_t n, int channels, const float* table) {
  HPC_GRID_STRIDE(i, n) out[i] = table[(i % channels) * 256 + in[i]];
}

__global__ void crop_flip_normalize_u8_kernel(const uint8_t* in, const int32_t* crops, float* out, int64_t total,
                                              int64_t h, int64_t w, int channels, const float* table) {
  HPC_GRID_STRIDE(i, total) {
    const int ch = static_cast<int>(i % channels);
    const int64_t pixel = i / channels, x = pixel % w, y = (pixel / w) % h, image = pixel / (w * h);
    const int32_t* cf = crops + 3 * image;
    const int64_t sy = y + cf[0], sx = (cf[2] ? w - 1 - x : x) + cf[1];
    const bool inside = sy >= 0 && sy < h && sx >= 0 && sx < w;
    const uint8_t v = inside ? in[((image * h + sy) * w + sx) * channels + ch] : uint8_t{0};
    out[i] = table[ch * 256 + v];
  }
}

}  // namespace

void relu_forward(DType t, const void* x, void* y, int64_t n, cudaStream_t stream) {
  map(t, x, nullptr, y, n, ReluForward{}, stream);
}

void relu_backward(DType t, const void* y, const void* dy, void* dx, int64_t n, cudaStream_t stream) {
  map(t, y, dy, dx, n, ReluBackward{}, stream);
}

void add(DType t, const void* a, const void* b, void* out, int64_t n, cudaStream_t stream) {
  map(t, a, b, out, n, Add{}, stream);
}

void convert(DType from, const void* in, DType to, void* out, int64_t n, float factor, int* non_finite,
             cudaStream_t stream) {
  if (n == 0) return;
  with_type(from, [&](auto from_tag) {
    with_type(to, [&](auto to_tag) {
      using From = decltype(from_tag);
      using To = decltype(to_tag);
      const auto* a = static_cast<const From*>(in);
      auto* b = static_cast<To*>(out);
      // Four values a thread when n allows it and each pointer is aligned to four of its elements.
      constexpr int in_bytes = 4 * sizeof(From), out_bytes = 4 * sizeof(To);
      if (pack_width<From>(n, {in}, in_bytes) == 4 && pack_width<To>(n, {out}, out_bytes) == 4)
        convert_kernel<From, To, 4><<<blocks_for(n / 4), kThreads, 0, stream>>>(a, b, n / 4, factor, non_finite);
      else
        convert_kernel<From, To, 1><<<blocks_for(n), kThreads, 0, stream>>>(a, b, n, factor, non_finite);
    });
  });
  CUDA_CHECK_LAUNCH();
}

void convert_spans(DType from, const void* in, float* out, const std::vector<Span>& spans, float factor,
                   cudaStream_t stream) {
  std::vector<SpanList> lists;
  HPC_CHECK(pack_spans(spans, &lists), "a conversion's span of negative offset or count");
  for (const SpanList& list : lists)
    with_type(from, [&](auto tag) {
      using From = decltype(tag);
      convert_spans_kernel<From>
          <<<blocks_for(list.total), kThreads, 0, stream>>>(static_cast<const From*>(in), out, list, factor);
      CUDA_CHECK_LAUNCH();
    });
}

void relu_forward(const float* x, float* y, int64_t n, cudaStream_t stream) {
  relu_forward(DType::F32, x, y, n, stream);
}

void relu_backward(const float* y, const float* dy, float* dx, int64_t n, cudaStream_t stream) {
  relu_backward(DType::F32, y, dy, dx, n, stream);
}

void add(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {
  add(DType::F32, a, b, out, n, stream);
}

void normalize_u8(const uint8_t* in, float* out, int64_t n, int channels, const float* table, cudaStream_t stream) {
  if (n == 0) return;
  normalize_u8_kernel<<<blocks_for(n), kThreads, 0, stream>>>(in, out, n, channels, table);
  CUDA_CHECK_LAUNCH();
}

void crop_flip_normalize_u8(const uint8_t* in, const int32_t* crops, float* out, int64_t n, int64_t h, int64_t w,
                            int channels, const float* table, cudaStream_t stream) {
  const int64_t total = n * h * w * channels;
  if (total == 0) return;
  crop_flip_normalize_u8_kernel<<<blocks_for(total), kThreads, 0, stream>>>(in, crops, out, total, h, w, channels,
                                                                            table);
  CUDA_CHECK_LAUNCH();
}

void scale_and_check(float* x, int64_t n, float factor, int* non_finite, cudaStream_t stream) {
  convert(DType::F32, x, DType::F32, x, n, factor, non_finite, stream);
}

}  // namespace hpc::kernels

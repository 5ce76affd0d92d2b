// The activation types of the kernels (F32, BF16, F16): every kernel computes in float, loading
// through to_f and rounding once to the nearest representable value when it stores (from_f),
// as PyTorch's elementwise kernels do; with_type turns a DType into that element type.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "core/error.hpp"
#include "core/tensor.hpp"

namespace hpc::kernels {

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// Calls f with a value of the element type that `t` names.
template <class F>
void with_type(DType t, F&& f) {
  switch (t) {
    case DType::F32: return f(float{});
    case DType::BF16: return f(__nv_bfloat16{});
    case DType::F16: return f(__half{});
    default: break;
  }
  throw Error(ErrorKind::Internal, detail::concat("no GPU kernel for ", dtype_name(t), " tensors"));
}

// V values of T that move as one aligned load or store (16 bytes: one 128-bit access).
template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// V values of T in `bytes` (16: one 128-bit access; batch norm may ask for 8) when V divides
// `count` (elements, or channels of a row) and every pointer is aligned to the access; else 1.
template <class T>
int pack_width(int64_t count, std::initializer_list<const void*> pointers, int bytes = 16) {
  const int wide = bytes / static_cast<int>(sizeof(T));
  if (count % wide != 0) return 1;
  for (const void* p : pointers)
    if (p && reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) != 0) return 1;
  return wide;
}

// Calls f with pack_width's answer as a compile-time constant: 16 bytes of T, or 1.
template <class T, class F>
void with_width(int v, F&& f) {
  constexpr int wide = 16 / static_cast<int>(sizeof(T));
  if (v == wide) f(std::integral_constant<int, wide>{});
  else f(std::integral_constant<int, 1>{});
}

}  // namespace hpc::kernels

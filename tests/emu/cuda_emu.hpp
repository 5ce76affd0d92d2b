// The CUDA kernels of kernels/ run on the CPU, so that every build tests them, not only the rare
// one with a GPU (kernels_emu_test). tests/emu/emulate_cu.py turns each .cu file into C++ that
// includes this header first: every launch `k<<<grid, block, shared, stream>>>(args)` becomes
// `::hpc::emu::launch(k, grid, block, shared, stream)(args)`, and this header gives the device
// built-ins a host meaning.
//
// How a launch runs (cuda_emu.cpp): its blocks one after another; each block's threads as
// fibers on this thread, each with its own stack, switched at every barrier (__syncthreads,
// __syncthreads_or, and a warp's shuffles, which wait for the warp). So
//   - a __shared__ variable is a static one: blocks never overlap, and one block's threads share
//     it. Each block finds it full of garbage (fresh_shared), not what the block before left;
//   - the order changes: blocks in grid order in one launch, in reverse in the next, and a
//     block's threads take their turns in index order or in reverse, every other block. A race
//     between threads (a read of what another thread writes before the barrier that should
//     order them) or between blocks of one launch then gives a wrong answer in some of them,
//     whichever side of it has the lower index;
//   - a barrier that some live thread of the block never reaches is reported, not hung on
//     (a deadlock, undefined on a GPU), and so is a __trap: both fail the launch as CUDA would,
//     with an error every later call returns;
//   - cudaMalloc's memory ends at a page the process may not touch (within 16 bytes of what was
//     asked; the test runs with HPCTRAIN_NO_MEMORY_CACHING=1, so each tensor is its own) and
//     starts with garbage: a read or write past a buffer's end faults at once, and a kernel
//     that reads what nobody wrote sees all-ones bytes (NaN, -1), not zeros;
//   - each thread's stack (256 KiB) lies above pages it may not touch: a thread that overflows
//     it faults, and is named, instead of writing over another thread's;
//   - an access misaligned for its type (a 16-byte Pack off a 16-byte boundary) traps, as a
//     GPU's fails ("misaligned address"), and is named: the emulated code is compiled with
//     GCC's alignment check (tests/CMakeLists.txt), where x86 would take most such loads
//     (not under Clang, whose check does not look at a struct's copy);
//   - a launch runs when it is made (the stream has finished it at once); a stream being
//     captured records it instead, and the graph replays what it recorded.
// One launch at a time, from one host thread (the tests'). What it cannot show: a race that
// gives the same answer in both orders (fibers run one at a time, and only switch at a barrier,
// so two threads' accesses never interleave between barriers) and the GPU's contraction of
// a * b + c into one rounding where the source does not ask for it (emulated code is compiled
// with -ffp-contract=off; the explicit __fmaf_rn fuses).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

namespace hpc::emu {

// The running thread's coordinates (set by the scheduler before it resumes a fiber).
extern uint3 g_thread_idx, g_block_idx;
extern dim3 g_block_dim, g_grid_dim;

// Which block runs: a new number for each block run, launches together.
extern uint64_t g_block_serial;

// A __shared__ variable, on the first arrival of each block's threads at its declaration (the
// call emulate_cu.py puts after it), filled with all-ones bytes: NaN in every floating-point
// type, -1 in every signed integer. A GPU's shared memory holds what the last block there left;
// a read before any write of the block then shows, not a zero or the previous block's value.
inline void fresh_shared(unsigned long long& mark, void* variable, size_t bytes) {
  if (mark == g_block_serial) return;
  mark = g_block_serial;
  std::memset(variable, 0xFF, bytes);
}

void sync_block();            // __syncthreads
int sync_block_or(int flag);  // __syncthreads_or
// A warp's exchange: this lane's `bytes` from `mine`, lane `from`'s into `theirs`, after every
// live lane of the warp has offered its own.
void exchange_in_warp(const void* mine, void* theirs, size_t bytes, unsigned from);
unsigned lane_of_thread();
// The emulated device's multiprocessors: 4 (small grids, quick on a CPU), or
// HPCTRAIN_EMU_MULTIPROCESSORS (132 is an H100's or H200's: the grids the GPU would get).
int multiprocessors();
[[noreturn]] void trap();

// Runs (or, on a stream being captured, records) `grid` blocks of `block` threads of `body`.
void run(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream, std::function<void()> body);

template <class... P>
struct Launch {
  void (*kernel)(P...);
  dim3 grid, block;
  size_t shared_bytes;
  cudaStream_t stream;
  template <class... A>
  void operator()(A&&... args) const {
    static_assert(sizeof...(A) == sizeof...(P), "a kernel launch with the wrong number of arguments");
    // As CUDA does: each argument converted to its parameter's type and copied when launched.
    std::tuple<std::decay_t<P>...> values(std::forward<A>(args)...);
    run(grid, block, shared_bytes, stream, [k = kernel, values] { std::apply(k, values); });
  }
};

template <class... P>
Launch<P...> launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t shared_bytes = 0,
                    cudaStream_t stream = nullptr) {
  return {kernel, grid, block, shared_bytes, stream};
}

}  // namespace hpc::emu

// ---- the device built-ins, on the host ----------------------------------------------------------

#define threadIdx (static_cast<const uint3&>(::hpc::emu::g_thread_idx))
#define blockIdx (static_cast<const uint3&>(::hpc::emu::g_block_idx))
#define blockDim (static_cast<const dim3&>(::hpc::emu::g_block_dim))
#define gridDim (static_cast<const dim3&>(::hpc::emu::g_grid_dim))
#define warpSize 32

#undef __shared__
#define __shared__ static
#undef __launch_bounds__
#define __launch_bounds__(...)

#define __syncthreads() ::hpc::emu::sync_block()
#define __syncthreads_or(flag) ::hpc::emu::sync_block_or((flag) ? 1 : 0)
#define __threadfence() std::atomic_thread_fence(std::memory_order_seq_cst)
#define __trap() ::hpc::emu::trap()

template <class T>
inline T __ldcg(const T* p) {
  return *p;
}

template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  if (mask != 0xffffffffu || width != 32) ::hpc::emu::trap();  // only what the kernels use
  T theirs;
  ::hpc::emu::exchange_in_warp(&v, &theirs, sizeof(T), ::hpc::emu::lane_of_thread() ^ static_cast<unsigned>(lane_mask));
  return theirs;
}

template <class T>
inline T atomicAdd(T* p, T v) {
  return std::atomic_ref<T>(*p).fetch_add(v);
}

// Rounded as written: one rounding each, never contracted (the emulated code is compiled with
// -ffp-contract=off), and the fused multiply-add rounded once.
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }

// CUDA's min and max take mixed operands (an int and an unsigned) as its device overloads do.
template <class A, class B>
inline std::common_type_t<A, B> min(A a, B b) {
  using C = std::common_type_t<A, B>;
  return static_cast<C>(a) < static_cast<C>(b) ? static_cast<C>(a) : static_cast<C>(b);
}
template <class A, class B>
inline std::common_type_t<A, B> max(A a, B b) {
  using C = std::common_type_t<A, B>;
  return static_cast<C>(a) < static_cast<C>(b) ? static_cast<C>(b) : static_cast<C>(a);
}
using std::exp;
using std::fmaxf;
using std::isfinite;
using std::log;
using std::sqrt;

// The device seam. CMake compiles device_cuda.cpp when the CUDA toolkit is present and
// device_none.cpp otherwise; nothing else in the code asks which one it got.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

struct CUstream_st;  // CUDA's stream (cudaStream_t is a pointer to it): this header needs no CUDA

namespace hpc::device {

// Number of CUDA GPUs visible to this process (respects CUDA_VISIBLE_DEVICES); 0 without CUDA.
int cuda_device_count();
// True when this binary was built with the CUDA backend.
bool built_with_cuda();
// One line describing the GPU support, for --version and logs.
std::string describe();

// The GPU of this rank: local rank modulo the visible GPUs (one rank per GPU on each host, as
// mpirun -npernode / Slurm --gpus-per-task arrange). Returns its index. Usage error when no
// GPU is visible or this build has no CUDA.
int select_gpu(int local_rank);
// A number that names the physical GPU select_gpu(local_rank) would take, the same in every
// process that sees it whatever CUDA_VISIBLE_DEVICES numbers it (a hash of its UUID); 0 when
// there is none. Two ranks with the same non-zero value would share one GPU.
uint64_t gpu_identity(int local_rank);
// The model of the GPU select_gpu(local_rank) would take ("NVIDIA H200"); "" when there is none.
std::string gpu_name(int local_rank);

// Device memory through the process's caching allocator (core/caching_allocator.hpp):
// allocate never returns nullptr (usage error when out of memory); release(nullptr) is a no-op.
void* allocate(size_t bytes);
void release(void* p);
// Page-locked host memory, which the GPU copies from without staging (cudaHostAlloc), or
// nullptr where it cannot be had (no CUDA in this build, or no GPU): the caller then takes
// ordinary memory. release_pinned frees what allocate_pinned returned.
void* allocate_pinned(size_t bytes);
void release_pinned(void* p);
// The stream zero() and copy() are ordered on: the compute stream of the process's GpuContext
// (nn/cuda/context.hpp), which sets it while it lives; nullptr (the default): the legacy
// default stream. The compute stream is non-blocking, so the legacy stream would not order
// these after its kernels: a block the caching allocator hands out again must be zeroed behind
// the kernels that still read it, and copies must see what they wrote.
void set_stream(CUstream_st* stream);
// Zero-fills device memory, enqueued on set_stream's stream (cudaMemsetAsync: ordered, and
// captured into a CUDA graph rather than breaking its capture).
void zero(void* p, size_t bytes);
enum class Copy { HostToDevice, DeviceToHost, DeviceToDevice };
// Synchronous copy (tests, checkpoints, set-up; the step loop uses streams): enqueued on
// set_stream's stream, after its work so far, and waited for.
void copy(void* dst, const void* src, size_t bytes, Copy direction);
// Bytes the allocator holds for tensors now, and the most it ever held (for the metrics).
size_t memory_in_use();
size_t peak_memory_in_use();
// Gives the blocks the caching allocator keeps for reuse back to the driver (cudaFree, which
// waits for the device): before a library call that takes memory with cudaMalloc of its own,
// which the cache would otherwise keep from it (cuDNN's cudnnFind*: nn/cuda/layers.cpp). Never
// while a CUDA graph is being captured. Nothing in a build without CUDA.
void empty_cache();

// A CUDA graph's capture against the calls of other threads that may synchronise the device
// (cudaFree, cudaFreeHost, nvJPEG's decode, which grows its own buffers with them): CUDA's
// thread-local capture mode lets another thread make such a call, but its implicit device-wide
// synchronisation may invalidate the capture under way, and the call itself fail (PyTorch's
// caching allocators likewise free nothing while a capture is under way). The capturing thread
// holds this from its cudaStreamBeginCapture to its cudaStreamEndCapture; the loader's threads
// hold it around such calls (allocate_pinned, release_pinned, the GPU decoder's batch). Each side
// waits for the other at most a capture's or a batch decode's time. Recursive: a thread that holds
// it may take it again.
inline std::unique_lock<std::recursive_mutex> exclude_capture() {
  static std::recursive_mutex held;
  return std::unique_lock<std::recursive_mutex>(held);
}

}  // namespace hpc::device

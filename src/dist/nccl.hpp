// NCCL behind the Communicator seam: collectives among one GPU per rank, for the gradient
// all-reduce of GPU training (DESIGN.md principle 2). Data pointers are device pointers.
//
// The Communicator collectives (set-up: broadcast, allgather, barrier) run on this
// communicator's own stream and return when done, as the MPI implementation does; while
// waiting they poll NCCL's asynchronous error state. The gradients' reduction does not wait:
// enqueue_weighted_sum puts a bucket's all-reduce on the stream and returns (the GPU engine
// orders it with events, train/engine/gpu_engine.cpp), and async_error, which the step watchdog polls
// from its thread (train/stop/watchdog.hpp), turns a peer that died into an error and an abort
// (which frees the stuck kernels) rather than a hang.
//
// Compiled only when CMake finds NCCL (HPCTRAIN_HAVE_NCCL).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "dist/communicator.hpp"

namespace hpc::dist {

class NcclCommunicator final : public Communicator {
 public:
  // Collective over every rank of `bootstrap` (the MPI world): rank 0 makes NCCL's unique id
  // and bootstrap broadcasts it. This rank's GPU is the current CUDA device
  // (device::select_gpu). bootstrap must outlive this communicator (abort goes through it).
  explicit NcclCommunicator(Communicator& bootstrap);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void allreduce_sum(float* data, int64_t n) override;
  void allreduce_sum(double* data, int64_t n) override;
  void broadcast(void* data, int64_t bytes, int root) override;
  // `value` is a host value; the result too (through a small device buffer).
  std::vector<uint64_t> allgather(uint64_t value) override;
  void barrier() override;
  std::unique_ptr<Communicator> duplicate() override;
  [[noreturn]] void abort(int exit_code) override;

  cudaStream_t stream() const { return stream_; }
  // Enqueues data = sum over the ranks of share * data on stream() and returns at once:
  // ncclAvg where share is 1 / size (every rank the same share, the usual step), else a
  // pre-multiplied sum (ncclRedOpCreatePreMulSum), one pass either way.
  void enqueue_weighted_sum(float* data, int64_t n, float share);
  // Empty while NCCL reports no asynchronous error; else a message, the communicator aborted.
  // Safe from another thread (ncclCommGetAsyncError is, and PyTorch's watchdog calls it so).
  std::string async_error();

 private:
  NcclCommunicator(Communicator& bootstrap, ncclComm_t comm);
  void init_stream_and_scratch();
  // Returns when the stream's work is done; throws (after aborting the communicator) when
  // NCCL reports an asynchronous error such as a lost peer.
  void wait();

  Communicator& bootstrap_;
  std::atomic<ncclComm_t> comm_ = nullptr;  // the watchdog's thread may abort it
  cudaStream_t stream_ = nullptr;
  uint64_t* scratch_ = nullptr;  // device: allgather values, the barrier's word
  int rank_ = 0, size_ = 1;
};

}  // namespace hpc::dist

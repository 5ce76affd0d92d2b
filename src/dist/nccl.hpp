// NCCL behind the Communicator seam: collectives among one GPU per rank, for the gradient
// all-reduce of GPU training (DESIGN.md principle 2). Data pointers are device pointers.
//
// Every collective runs on this communicator's own stream and the call returns when it is
// done, as the MPI implementation does, so the GradientBucketer's communication thread uses it
// unchanged; the GPU overlaps it with the compute stream's backward kernels. While waiting it
// polls NCCL's asynchronous error state, so a peer that died shows up as an error here
// (ncclCommAbort, then the whole job ends) rather than as a hang; a peer that hangs silently is
// the step watchdog's (train/watchdog.hpp).
//
// Compiled only when CMake finds NCCL (HPCTRAIN_HAVE_NCCL).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <memory>
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

 private:
  NcclCommunicator(Communicator& bootstrap, ncclComm_t comm);
  void init_stream_and_scratch();
  // Returns when the stream's work is done; throws (after aborting the communicator) when
  // NCCL reports an asynchronous error such as a lost peer.
  void wait();

  Communicator& bootstrap_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  uint64_t* scratch_ = nullptr;  // device: allgather values, the barrier's word
  int rank_ = 0, size_ = 1;
};

}  // namespace hpc::dist

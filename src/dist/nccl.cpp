#include "dist/nccl.hpp"

#include <sched.h>

#include <cstdlib>
#include <exception>

#include "core/cuda_check.hpp"
#include "core/device.hpp"

#define NCCL_CHECK(expr) HPC_GPU_CHECK("NCCL", expr, ncclSuccess, ncclGetErrorString)

namespace hpc::dist {

NcclCommunicator::NcclCommunicator(Communicator& bootstrap)
    : bootstrap_(bootstrap), rank_(bootstrap.rank()), size_(bootstrap.size()) {
  ncclUniqueId id{};
  if (rank_ == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  if (size_ > 1) bootstrap_.broadcast(&id, sizeof id, 0);
  NCCL_CHECK(ncclCommInitRank(&comm_, size_, id, rank_));
  init_stream_and_scratch();
}

NcclCommunicator::NcclCommunicator(Communicator& bootstrap, ncclComm_t comm)
    : bootstrap_(bootstrap), comm_(comm), rank_(bootstrap.rank()), size_(bootstrap.size()) {
  init_stream_and_scratch();
}

void NcclCommunicator::init_stream_and_scratch() {
  // Non-blocking: must not synchronise with the legacy default stream the compute work may use.
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  scratch_ = static_cast<uint64_t*>(device::allocate(sizeof(uint64_t) * static_cast<size_t>(size_)));
}

NcclCommunicator::~NcclCommunicator() {
  // No throwing here: a failed destroy at exit is not worth a crash. While an error unwinds,
  // the peers may never issue the collectives this rank queued: waiting for the stream or a
  // cooperative destroy could hang, so the communicator is aborted instead (main then ends
  // the job).
  if (std::uncaught_exceptions() > 0) {
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
  } else if (stream_) {
    cudaStreamSynchronize(stream_);
  }
  device::release(scratch_);
  if (comm_) ncclCommDestroy(comm_);
  if (stream_) cudaStreamDestroy(stream_);
}

void NcclCommunicator::wait() {
  for (;;) {
    const cudaError_t state = cudaStreamQuery(stream_);
    if (state == cudaSuccess) return;
    if (state != cudaErrorNotReady) CUDA_CHECK(state);
    ncclResult_t async = ncclSuccess;
    NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
    if (async != ncclSuccess) {
      const char* detail = ncclGetLastError(comm_);
      ncclCommAbort(comm_);  // frees the stream's stuck kernels
      comm_ = nullptr;
      throw Error(ErrorKind::Internal, detail::concat("NCCL error during a collective: ", ncclGetErrorString(async),
                                                      detail && *detail ? std::string(" (") + detail + ")" : "",
                                                      "; a peer rank died or lost its network?"));
    }
    sched_yield();
  }
}

void NcclCommunicator::allreduce_sum(float* data, int64_t n) {
  NCCL_CHECK(ncclAllReduce(data, data, static_cast<size_t>(n), ncclFloat, ncclSum, comm_, stream_));
  wait();
}

void NcclCommunicator::allreduce_sum(double* data, int64_t n) {
  NCCL_CHECK(ncclAllReduce(data, data, static_cast<size_t>(n), ncclDouble, ncclSum, comm_, stream_));
  wait();
}

void NcclCommunicator::broadcast(void* data, int64_t bytes, int root) {
  NCCL_CHECK(ncclBroadcast(data, data, static_cast<size_t>(bytes), ncclUint8, root, comm_, stream_));
  wait();
}

std::vector<uint64_t> NcclCommunicator::allgather(uint64_t value) {
  CUDA_CHECK(cudaMemcpyAsync(scratch_ + rank_, &value, sizeof value, cudaMemcpyHostToDevice, stream_));
  NCCL_CHECK(ncclAllGather(scratch_ + rank_, scratch_, 1, ncclUint64, comm_, stream_));
  std::vector<uint64_t> all(static_cast<size_t>(size_));
  CUDA_CHECK(cudaMemcpyAsync(all.data(), scratch_, sizeof(uint64_t) * all.size(), cudaMemcpyDeviceToHost, stream_));
  wait();
  return all;
}

void NcclCommunicator::barrier() {
  NCCL_CHECK(ncclAllReduce(scratch_, scratch_, 1, ncclUint64, ncclSum, comm_, stream_));
  wait();
}

std::unique_ptr<Communicator> NcclCommunicator::duplicate() {
  ncclComm_t twin = nullptr;
  NCCL_CHECK(ncclCommSplit(comm_, 0, rank_, &twin, nullptr));
  return std::unique_ptr<Communicator>(new NcclCommunicator(bootstrap_, twin));
}

void NcclCommunicator::abort(int exit_code) {
  if (comm_) ncclCommAbort(comm_);
  comm_ = nullptr;
  bootstrap_.abort(exit_code);
  std::_Exit(exit_code);  // not reached: the bootstrap's abort ends the job
}

}  // namespace hpc::dist

#include "dist/nccl.hpp"

#include <sched.h>

#include <cstdlib>
#include <exception>

#include "core/cuda_check.hpp"
#include "core/device.hpp"
#include "dist/bucketer.hpp"

#define NCCL_CHECK(expr) HPC_GPU_CHECK("NCCL", expr, ncclSuccess, ncclGetErrorString)

namespace hpc::dist {

NcclCommunicator::NcclCommunicator(Communicator& bootstrap)
    : bootstrap_(bootstrap), rank_(bootstrap.rank()), size_(bootstrap.size()) {
  ncclUniqueId id{};
  if (rank_ == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  if (size_ > 1) bootstrap_.broadcast(&id, sizeof id, 0);
  ncclComm_t comm = nullptr;
  NCCL_CHECK(ncclCommInitRank(&comm, size_, id, rank_));
  comm_ = comm;
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
    if (ncclComm_t c = comm_.exchange(nullptr)) ncclCommAbort(c);
  } else if (stream_) {
    cudaStreamSynchronize(stream_);
  }
  device::release(scratch_);
  if (ncclComm_t c = comm_.exchange(nullptr)) ncclCommDestroy(c);
  if (stream_) cudaStreamDestroy(stream_);
}

std::string NcclCommunicator::async_error() {
  ncclComm_t comm = comm_.load();
  if (!comm) return "the NCCL communicator was aborted";
  ncclResult_t async = ncclSuccess;
  const ncclResult_t polled = ncclCommGetAsyncError(comm, &async);
  if (polled != ncclSuccess) async = polled;
  if (async == ncclSuccess || async == ncclInProgress) return {};
  const char* detail = ncclGetLastError(comm);
  const std::string message =
      detail::concat("NCCL error during a collective: ", ncclGetErrorString(async),
                     detail && *detail ? std::string(" (") + detail + ")" : "", "; a peer rank died or lost its network?");
  if (comm_.exchange(nullptr) == comm) ncclCommAbort(comm);  // frees the stream's stuck kernels
  return message;
}

// The set-up collectives only (the gradients' do not wait: enqueue_weighted_sum).
void NcclCommunicator::wait() {
  for (;;) {
    const cudaError_t state = cudaStreamQuery(stream_);
    if (state == cudaSuccess) return;
    if (state != cudaErrorNotReady) CUDA_CHECK(state);
    if (std::string error = async_error(); !error.empty()) throw Error(ErrorKind::Internal, error);
    sched_yield();
  }
}

void NcclCommunicator::enqueue_weighted_sum(float* data, int64_t n, float share) {
  const auto count = static_cast<size_t>(n);
  if (even_share(share, size_)) {
    NCCL_CHECK(ncclAllReduce(data, data, count, ncclFloat, ncclAvg, comm_, stream_));
    return;
  }
  ncclRedOp_t op;
  NCCL_CHECK(ncclRedOpCreatePreMulSum(&op, &share, ncclFloat, ncclScalarHostImmediate, comm_));
  const ncclResult_t r = ncclAllReduce(data, data, count, ncclFloat, op, comm_, stream_);
  // NCCL allows destroying the operator once the last call that names it has returned.
  ncclRedOpDestroy(op, comm_);
  NCCL_CHECK(r);
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
  NCCL_CHECK(ncclCommSplit(comm_.load(), 0, rank_, &twin, nullptr));
  return std::unique_ptr<Communicator>(new NcclCommunicator(bootstrap_, twin));
}

void NcclCommunicator::abort(int exit_code) {
  if (ncclComm_t c = comm_.exchange(nullptr)) ncclCommAbort(c);
  bootstrap_.abort(exit_code);
  std::_Exit(exit_code);  // not reached: the bootstrap's abort ends the job
}

}  // namespace hpc::dist

// The Communicator seam (DESIGN.md principle 2): collectives among the ranks of one job.
// mpi.cpp implements it over MPI for CPU training; the GPU issue adds NCCL behind the same
// interface. dist/ knows nothing of layers, and nn/ nothing of MPI.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace hpc::dist {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In-place sum over all ranks.
  virtual void allreduce_sum(float* data, int64_t n) = 0;
  virtual void allreduce_sum(double* data, int64_t n) = 0;
  // The root's bytes to every rank.
  virtual void broadcast(void* data, int64_t bytes, int root) = 0;
  // Every rank's value, in rank order, on every rank.
  virtual std::vector<uint64_t> allgather(uint64_t value) = 0;
  virtual void barrier() = 0;
  // Every rank's bytes, in rank order, on the root (empty elsewhere). For rare, bounded
  // payloads (the trace's buffered events, train/observe/trace.hpp): this default moves them with one
  // broadcast per rank; mpi.cpp overrides it with one MPI_Gatherv.
  virtual std::vector<std::string> gather_bytes(const std::string& mine, int root);
  // A communicator over the same ranks whose collectives never match this one's: for a
  // second thread's collectives (the gradient buckets run on their own thread).
  virtual std::unique_ptr<Communicator> duplicate() = 0;
  // Ends the whole job (every rank on every host) with this exit code: for an error one rank
  // meets alone, where waiting for the others in a collective would hang.
  [[noreturn]] virtual void abort(int exit_code) = 0;
};

// A world of one: every collective of one rank is the identity. What a process no launcher started
// uses (mpi.cpp: no MPI at all), and the tests' bootstrap of one rank.
class SelfCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void allreduce_sum(float*, int64_t) override {}
  void allreduce_sum(double*, int64_t) override {}
  void broadcast(void*, int64_t, int) override {}
  std::vector<uint64_t> allgather(uint64_t value) override { return {value}; }
  void barrier() override {}
  std::unique_ptr<Communicator> duplicate() override { return std::make_unique<SelfCommunicator>(); }
  [[noreturn]] void abort(int exit_code) override {
    std::fflush(nullptr);
    std::_Exit(exit_code);
  }
};

// The root's string on every rank.
std::string broadcast_string(Communicator& comm, const std::string& s, int root);
// Every rank's string, by rank, on every rank: one all-gather of their hashes, then one broadcast
// per distinct string (host names, the libraries each rank computes with: a few among many ranks).
std::vector<std::string> allgather_strings(Communicator& comm, const std::string& mine);
// Each distinct one of the ranks' strings once, in the order of their first ranks, joined by
// `separator` (the run's hosts, the kernels it computes with).
std::string distinct_joined(const std::vector<std::string>& by_rank, const std::string& separator);

}  // namespace hpc::dist

// The MPI process context: MPI is initialised once, here, and finalised when the context
// goes out of scope (not at all in a process no launcher started). It knows this process's rank, the world size, its local rank and the
// number of ranks on its host (ranks sharing memory), and the host's name, which every
// error from a multi-rank job carries.
#pragma once

#include <memory>
#include <string>

#include "dist/communicator.hpp"

namespace hpc::dist {

class ProcessContext {
 public:
  // Initialises MPI where a launcher (mpirun, srun, ...) started the process; a process started
  // without one is a world of one that never initialises MPI.
  ProcessContext(int* argc, char*** argv);
  ~ProcessContext();  // finalize()
  ProcessContext(const ProcessContext&) = delete;
  ProcessContext& operator=(const ProcessContext&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  const std::string& host() const { return host_; }
  // "rank 1 on node7": how errors name where they happened.
  std::string where() const;
  Communicator& world() { return *comm_; }
  // Whether two threads may make MPI calls at once (MPI_THREAD_MULTIPLE).
  bool thread_multiple() const { return thread_multiple_; }
  // This rank's share of the CPUs the ranks on its host may run on (their affinity masks, which
  // the ranks exchange at start-up: cpus::fair_share): what its math threads may use.
  double cpu_share() const { return cpu_share_; }
  // Ends MPI here rather than at the end of scope (MPI_Finalize: it waits for every rank); the
  // context is not used after it. Once is enough; the destructor does it when this has not.
  void finalize();

 private:
  int rank_ = 0, world_ = 1, local_rank_ = 0, local_size_ = 1;
  std::string host_;
  bool thread_multiple_ = false;
  bool mpi_ = false;  // MPI initialised (by this context, to be finalised by it)
  double cpu_share_ = 1;
  std::unique_ptr<Communicator> comm_;
};

// Math-library threads per rank when --threads is 0: the rank's share of the CPUs its affinity
// lets it run on (shared with the ranks on its host whose masks overlap), within the cgroup's CPU
// quota, so that neither a bound rank nor a limited container is oversubscribed.
int default_threads(const ProcessContext& ctx);

// Math-library threads per rank for a --threads of `given` (training, evaluate, predict alike):
// `given` when positive; else OMP_NUM_THREADS where it is set to a number of threads (the first of
// a list: OpenMP's nested levels; a value that is none is one warning, and left aside); else
// default_threads.
int math_threads(const ProcessContext& ctx, int given);

}  // namespace hpc::dist

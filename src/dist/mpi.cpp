// Open MPI behind the Communicator interface, and the process context that owns MPI.
// The C API only: the deprecated C++ bindings would need their own library.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <unistd.h>

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "core/cpus.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "dist/process.hpp"

namespace hpc::dist {
namespace {

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(len));
}

std::string g_where = "rank 0";  // set once the context knows its rank and host

}  // namespace

// Every MPI call is checked; failures carry the call, the rank and host, and MPI's own words.
#define MPI_CHECK(call)                                                                               \
  do {                                                                                                \
    const int mpi_rc_ = (call);                                                                       \
    if (mpi_rc_ != MPI_SUCCESS)                                                                       \
      ::hpc::detail::throw_internal(__FILE__, __LINE__, #call,                                        \
                                    ::hpc::detail::concat(g_where, ": ", mpi_error_string(mpi_rc_))); \
  } while (0)

namespace {

class MpiCommunicator final : public Communicator {
 public:
  // owned: the communicator is freed with this object (a duplicate; not MPI_COMM_WORLD).
  MpiCommunicator(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
    MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    MPI_CHECK(MPI_Comm_size(comm_, &size_));
  }
  ~MpiCommunicator() override {
    if (owned_) MPI_Comm_free(&comm_);
  }
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;
  std::unique_ptr<Communicator> duplicate() override {
    MPI_Comm dup;
    MPI_CHECK(MPI_Comm_dup(comm_, &dup));
    MPI_CHECK(MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN));
    return std::make_unique<MpiCommunicator>(dup, true);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void allreduce_sum(float* data, int64_t n) override { allreduce(data, n, MPI_FLOAT); }
  void allreduce_sum(double* data, int64_t n) override { allreduce(data, n, MPI_DOUBLE); }
  void broadcast(void* data, int64_t bytes, int root) override {
    auto* p = static_cast<char*>(data);
    for (int64_t done = 0; done < bytes;) {  // MPI counts are ints
      const int chunk = static_cast<int>(std::min<int64_t>(bytes - done, INT_MAX));
      MPI_CHECK(MPI_Bcast(p + done, chunk, MPI_BYTE, root, comm_));
      done += chunk;
    }
  }
  std::vector<uint64_t> allgather(uint64_t value) override {
    std::vector<uint64_t> all(static_cast<size_t>(size_));
    MPI_CHECK(MPI_Allgather(&value, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, comm_));
    return all;
  }
  void barrier() override { MPI_CHECK(MPI_Barrier(comm_)); }
  std::vector<std::string> gather_bytes(const std::string& mine, int root) override {
    // MPI counts and displacements are ints: the callers keep their payloads far below 2 GiB.
    HPC_CHECK(mine.size() < INT_MAX / static_cast<size_t>(size_), "gather_bytes of ", mine.size(), " bytes");
    const int count = static_cast<int>(mine.size());
    std::vector<int> counts(rank_ == root ? static_cast<size_t>(size_) : 0), starts(counts.size());
    MPI_CHECK(MPI_Gather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, root, comm_));
    int64_t total = 0;
    for (size_t r = 0; r < counts.size(); ++r) {
      starts[r] = static_cast<int>(total);
      total += counts[r];
    }
    HPC_CHECK(total < INT_MAX, "gather_bytes of ", total, " bytes in all");
    std::string joined(static_cast<size_t>(total), '\0');
    MPI_CHECK(MPI_Gatherv(mine.data(), count, MPI_BYTE, joined.data(), counts.data(), starts.data(), MPI_BYTE, root,
                          comm_));
    std::vector<std::string> all;
    for (size_t r = 0; r < counts.size(); ++r)
      all.push_back(joined.substr(static_cast<size_t>(starts[r]), static_cast<size_t>(counts[r])));
    return all;
  }
  [[noreturn]] void abort(int exit_code) override {
    MPI_Abort(comm_, exit_code);
    std::_Exit(exit_code);  // MPI_Abort does not return; if it did, do not hang either
  }

 private:
  // The sum of every element is taken in rank order on one rank, ((x0 + x1) + x2) + ..., and
  // sent to the others: its bits depend on the world size alone. MPI_Allreduce's algorithm (ring,
  // recursive doubling, Rabenseifner: chosen by the message's size) sums each element in an order
  // that depends on the message's length and the element's place in it, so on 3 ranks another
  // --bucket-mb (other buckets), or a relaunch under another MPI tuning, changed the bits of
  // training. A reduce-scatter of W contiguous parts (rank r sums part r), then an allgather:
  // what a ring moves. On 2 ranks the one addition is the one MPI_SUM makes, in either order.
  template <class T>
  void allreduce(T* data, int64_t n, MPI_Datatype type) {
    if (size_ == 1) return;
    const auto w = static_cast<int64_t>(size_);
    // MPI counts and displacements are ints: pieces whose W parts received (each at most
    // len / W + 1 long) fit in one.
    const int64_t piece = INT_MAX - w;
    for (int64_t done = 0; done < n;) {
      const int64_t len = std::min(n - done, piece);
      T* x = data + done;
      std::vector<int> counts(static_cast<size_t>(size_)), starts(counts.size());
      for (int64_t r = 0; r < w; ++r) {
        starts[static_cast<size_t>(r)] = static_cast<int>(len * r / w);
        counts[static_cast<size_t>(r)] = static_cast<int>(len * (r + 1) / w - len * r / w);
      }
      const int mine = counts[static_cast<size_t>(rank_)];
      std::vector<int> recv_counts(counts.size(), mine), recv_starts(counts.size());
      for (size_t r = 0; r < recv_starts.size(); ++r) recv_starts[r] = static_cast<int>(r) * mine;
      std::vector<T>& parts = scratch<T>();
      parts.resize(static_cast<size_t>(mine) * counts.size());
      MPI_CHECK(MPI_Alltoallv(x, counts.data(), starts.data(), type, parts.data(), recv_counts.data(),
                              recv_starts.data(), type, comm_));
      T* sum = x + starts[static_cast<size_t>(rank_)];
      for (int i = 0; i < mine; ++i) {
        T acc = parts[static_cast<size_t>(i)];
        for (size_t r = 1; r < counts.size(); ++r) acc += parts[r * static_cast<size_t>(mine) + static_cast<size_t>(i)];
        sum[i] = acc;
      }
      MPI_CHECK(MPI_Allgatherv(MPI_IN_PLACE, 0, type, x, counts.data(), starts.data(), type, comm_));
      done += len;
    }
  }
  template <class T>
  std::vector<T>& scratch() {
    if constexpr (std::is_same_v<T, float>) return float_parts_;
    else return double_parts_;
  }

  MPI_Comm comm_;
  bool owned_;
  int rank_ = 0, size_ = 1;
  std::vector<float> float_parts_;  // allreduce's parts received, kept between calls
  std::vector<double> double_parts_;
};

// Whether a launcher started this process as a rank of a job: mpirun/orted (Open MPI), a PMIx or
// PMI server (srun, MPICH's hydra), MVAPICH's mpirun_rsh, or any step of a Slurm job (where MPI
// decides, as it always has). HPCTRAIN_USE_MPI=1 asks for MPI (a singleton) regardless.
bool started_by_a_launcher() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_FD", "PMI_SIZE", "MV2_COMM_WORLD_RANK",
                        "SLURM_PROCID"})
    if (std::getenv(v) != nullptr) return true;
  const char* forced = std::getenv("HPCTRAIN_USE_MPI");
  return forced != nullptr && std::strcmp(forced, "1") == 0;
}

std::string host_name() {
  char name[HOST_NAME_MAX + 1] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

// The ranks on a host exchange their affinity masks (as bitsets as wide as the largest CPU id
// among them) so that each knows how many of them may run on each of its CPUs.
double local_cpu_share(MPI_Comm local, int local_size, int local_rank) {
  const std::vector<int> ids = cpus::affinity();
  int words = ids.empty() ? 1 : ids.back() / 64 + 1;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &words, 1, MPI_INT, MPI_MAX, local));
  std::vector<uint64_t> mine(static_cast<size_t>(words), 0), all(mine.size() * static_cast<size_t>(local_size));
  for (int c : ids) mine[static_cast<size_t>(c / 64)] |= uint64_t{1} << (c % 64);
  MPI_CHECK(MPI_Allgather(mine.data(), words, MPI_UINT64_T, all.data(), words, MPI_UINT64_T, local));
  std::vector<std::vector<int>> masks(static_cast<size_t>(local_size));
  for (size_t r = 0; r < masks.size(); ++r)
    for (int c = 0; c < 64 * words; ++c)
      if (all[r * static_cast<size_t>(words) + static_cast<size_t>(c / 64)] >> (c % 64) & 1) masks[r].push_back(c);
  return cpus::fair_share(masks, static_cast<size_t>(local_rank));
}

}  // namespace

ProcessContext::ProcessContext(int* argc, char*** argv) {
  if (!started_by_a_launcher()) {
    host_ = host_name();
    g_where = where();
    thread_multiple_ = true;  // no MPI calls at all: the communication thread has none to make
    cpu_share_ = cpus::fair_share({cpus::affinity()}, 0);  // as local_cpu_share computes it for one rank
    // Open MPI's singleton MPI_Init would fork an orted and wire it up, a second or more on a busy
    // machine, for collectives of one rank, which are the identity.
    comm_ = std::make_unique<SelfCommunicator>();
    return;
  }
  mpi_ = true;
  int initialised = 0;
  MPI_CHECK(MPI_Initialized(&initialised));
  HPC_CHECK(!initialised, "MPI initialised twice");
  // The gradient all-reduce runs on a communication thread while the main thread computes;
  // the main thread's own MPI calls happen only while that thread is idle, so SERIALIZED
  // suffices, and MULTIPLE is asked for where the library has it.
  int provided = 0;
  MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
  // Errors come back as return codes (checked by MPI_CHECK) instead of killing the job
  // before it can say what went wrong.
  MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_));
  char name[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  MPI_CHECK(MPI_Get_processor_name(name, &len));
  host_.assign(name, static_cast<size_t>(len));
  g_where = where();
  log::set_process(rank_, world_, g_where);
  HPC_CHECK(provided >= MPI_THREAD_SERIALIZED, where(),
            ": the MPI library offers no thread support beyond level ", provided,
            " (hpctrain needs MPI_THREAD_SERIALIZED for its communication thread)");
  MPI_Comm local;
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local));
  MPI_CHECK(MPI_Comm_rank(local, &local_rank_));
  MPI_CHECK(MPI_Comm_size(local, &local_size_));
  cpu_share_ = local_cpu_share(local, local_size_, local_rank_);
  MPI_CHECK(MPI_Comm_free(&local));
  thread_multiple_ = provided >= MPI_THREAD_MULTIPLE;
  comm_ = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, false);
}

ProcessContext::~ProcessContext() { finalize(); }

void ProcessContext::finalize() {
  comm_.reset();
  if (!mpi_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

std::string ProcessContext::where() const { return "rank " + std::to_string(rank_) + " on " + host_; }

}  // namespace hpc::dist

// The MPI all-reduce this machine gives the gradient buckets, by message size, for the
// scaling model's "local" cluster (bench/scaling_model.py --fit-sweep fits alpha and beta).
//   mpirun -np R allreduce_sweep [--max-bytes B] [--seconds-per-size S] [--cold-bytes C]
//   (default 16 MiB, 0.2 s; C: write C bytes before each timed call, the caches cold, as a step
//   leaves them for the trainer's buckets; by default none, the loop's buffers hot)
// Sizes are 4 bytes, then x4 up to B; each is all-reduced in place as float sums, as
// GradientBucketer does, repeatedly for about S seconds (at least 5 times, after 2 untimed
// warm-up calls), and rank 0 prints one JSON line per size: ranks, bytes, the median seconds
// of one all-reduce (each timed from a barrier, so the slowest rank sets it) and the repeats.
// MPI runs as in hpctrain: initialised by its ProcessContext, every call made by a thread other
// than the main one, which waits for it (the bucketer's communication thread), and the sum is
// the trainer's own (dist::Communicator::allreduce_sum on a duplicate of the world: its rank-order
// reduce-scatter and allgather, src/dist/mpi.cpp), not MPI_Allreduce, whose algorithm and time
// differ from it.
#define OMPI_SKIP_MPICXX 1  // the C API only: the C++ bindings need a library not linked
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dist/communicator.hpp"
#include "dist/process.hpp"

namespace {
struct Options {
  long long max_bytes = 16LL << 20;
  double seconds_per_size = 0.2;
  long long cold_bytes = 0;
};

// One line on rank 0 and exit code 2 for a bad option, every rank alike (all parse the same argv).
[[noreturn]] void usage_error(int rank, const std::string& message) {
  if (rank == 0) std::fprintf(stderr, "allreduce_sweep: error: %s\n", message.c_str());
  MPI_Finalize();
  std::exit(2);
}

Options parse(int argc, char** argv, int rank) {
  Options o;
  for (int i = 1; i < argc; i += 2) {
    const std::string name = argv[i];
    if (name == "--help" || name == "-h") {
      if (rank == 0)
        std::printf("mpirun -np R allreduce_sweep [--max-bytes B] [--seconds-per-size S] [--cold-bytes C]\n"
                    "  (default 16 MiB, 0.2 s; C: bytes written before each timed call, the caches cold; default none)\n");
      MPI_Finalize();
      std::exit(0);
    }
    if (name.rfind("--", 0) != 0) usage_error(rank, "'" + name + "' is no option (try --help)");
    if (i + 1 >= argc) usage_error(rank, name + " needs a value");
    char* end = nullptr;
    const double value = std::strtod(argv[i + 1], &end);
    if (*end != '\0' || !(value > 0)) usage_error(rank, name + " must be a positive number, got '" + argv[i + 1] + "'");
    if (name == "--max-bytes") o.max_bytes = value > 1e18 ? 1LL << 62 : static_cast<long long>(value);
    else if (name == "--seconds-per-size") o.seconds_per_size = value;
    else if (name == "--cold-bytes") o.cold_bytes = value > 1e18 ? 1LL << 62 : static_cast<long long>(value);
    else usage_error(rank, "unknown option " + name);
  }
  if (o.max_bytes < 4 || o.max_bytes > (1LL << 30)) usage_error(rank, "--max-bytes must be 4 to 1073741824");
  if (o.seconds_per_size > 600) usage_error(rank, "--seconds-per-size must be at most 600");
  if (o.cold_bytes > (1LL << 34)) usage_error(rank, "--cold-bytes must be at most 17179869184 (16 GiB)");
  return o;
}

// Median seconds of one in-place float all-reduce of `count` elements.
std::pair<double, int> time_allreduce(hpc::dist::Communicator& comm, std::vector<float>& data, int count,
                                      double budget, std::vector<float>& cold) {
  for (int w = 0; w < 2; ++w) comm.allreduce_sum(data.data(), count);
  std::vector<double> times;
  double spent = 0;
  int go = 1;
  while (go) {
    const double evicting = MPI_Wtime();
    for (size_t i = 0; i < cold.size(); i += 16) cold[i] += 1.0f;  // a line at a time: the caches evicted
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    comm.allreduce_sum(data.data(), count);
    double t = MPI_Wtime() - t0;
    // The slowest rank's time is the all-reduce's; rank 0 decides for all when to stop.
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    times.push_back(t);
    spent += t + (t0 - evicting);  // the evictions count against the budget: --cold-bytes costs repeats, not time
    go = times.size() < 5 || spent < budget;
    MPI_Bcast(&go, 1, MPI_INT, 0, MPI_COMM_WORLD);
  }
  std::nth_element(times.begin(), times.begin() + static_cast<long>(times.size() / 2), times.end());
  return {times[times.size() / 2], static_cast<int>(times.size())};
}
}  // namespace

int main(int argc, char** argv) {
  hpc::dist::ProcessContext ctx(&argc, &argv);
  int initialized = 0, provided = 0;
  MPI_Initialized(&initialized);
  // Started without a launcher: a world of one, which the context leaves without MPI; the timing
  // calls (MPI_Wtime, the barrier) still want it.
  if (!initialized) MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Query_thread(&provided);
  const int rank = ctx.rank(), size = ctx.world_size();
  const Options o = parse(argc, argv, rank);
  if (provided < MPI_THREAD_SERIALIZED) usage_error(rank, "this MPI gives no thread support (hpctrain needs it too)");
  const std::unique_ptr<hpc::dist::Communicator> comm = ctx.world().duplicate();
  std::vector<float> data(static_cast<size_t>(o.max_bytes / 4), 1.0f);
  std::vector<float> cold(static_cast<size_t>(o.cold_bytes / 4), 0.0f);
  std::thread communication([&] {
    for (long long bytes = 4; bytes <= o.max_bytes; bytes *= 4) {
      const auto [seconds, repeats] = time_allreduce(*comm, data, static_cast<int>(bytes / 4), o.seconds_per_size, cold);
      if (rank == 0)
        std::printf("{\"ranks\":%d,\"bytes\":%lld,\"seconds\":%.9g,\"repeats\":%d}\n", size, bytes, seconds, repeats);
      std::fflush(stdout);
    }
  });
  communication.join();
  if (!initialized) MPI_Finalize();  // else the context's end does
  return 0;
}

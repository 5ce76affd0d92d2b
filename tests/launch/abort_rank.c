/* A rank that fails by itself (MPI_Abort, exit code 3) while the others wait for it in a
   collective and take mpirun's SIGTERM as hpctrain takes it: as a stop for later, not an end. For
   rank_hosts.sh: the failing rank's host is the one to blame, not the host of the ranks that
   mpirun then kills before they can report. */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

static void stop_later(int sig) { (void)sig; }

int main(int argc, char** argv) {
  int rank = 0, size = 1;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  signal(SIGTERM, stop_later);
  if (rank == size - 1) {
    sleep(1);
    fprintf(stderr, "rank %d: error: cannot read its shard\n", rank);
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Finalize();
  return 0;
}

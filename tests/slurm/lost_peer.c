/* For two_clusters.sh: two MPI jobs of two local Slurm clusters on one machine, where the rank of
   one job that lost its peer connects to the port the peer held, which a rank of the other job now
   holds (Open MPI's TCP transport takes each rank's port from the same range, lowest free first).
     lost_peer lose GO   rank 1 leaves right after MPI_Init; rank 0 waits for the file GO, then
                         sends to rank 1 (a connection to its old port)
     lost_peer late GO   rank 0 waits for the file GO before MPI_Init, so rank 1 waits in
                         MPI_Init's exchange with its port open; then an allreduce, "ok N" */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int wait_for(const char* path) {
  for (int i = 0; i < 1200; ++i) {  /* 120 s */
    if (access(path, F_OK) == 0) return 0;
    usleep(100000);
  }
  fprintf(stderr, "lost_peer: %s did not appear within 120 s\n", path);
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 3 || (strcmp(argv[1], "lose") != 0 && strcmp(argv[1], "late") != 0)) {
    fprintf(stderr, "usage: lost_peer lose|late GO_FILE\n");
    return 2;
  }
  const char* rank_env = getenv("SLURM_PROCID");
  int late = strcmp(argv[1], "late") == 0, rank = 0, one = 1, sum = 0;
  if (late && rank_env && strcmp(rank_env, "0") == 0 && wait_for(argv[2]) != 0) return 1;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (late) {
    MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) printf("ok %d\n", sum);
    MPI_Finalize();
    return 0;
  }
  if (rank == 1) _exit(3);
  if (wait_for(argv[2]) != 0) return 1;
  printf("sending\n");
  fflush(stdout);
  MPI_Send(&one, 1, MPI_INT, 1, 0, MPI_COMM_WORLD);
  pause();  /* its peer is gone: the test cancels the job */
  return 0;
}

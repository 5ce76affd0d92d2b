#!/usr/bin/env bash
# Two local clusters on one machine (the tests of two sessions, a demo beside CI) each run an MPI
# job under srun. Open MPI names a job srun starts after its Slurm job and step ids alone, and its
# TCP transport takes a connection from any process of that name. When both clusters numbered
# their jobs from 1, a rank of cluster 1's job 1.0 that had lost its peer connected to the port the
# peer had held, which a rank of cluster 2's job 1.0 held by then, and that rank took the message as
# its own: a segfault in MPI_Init (its handler not yet there), or a stray message later. CI saw it
# twice as slurm_time_limit's rank 1 crashing at start-up. Each cluster now numbers its jobs from a
# range of its own (local-cluster.sh, FirstJobId): the stray connection is refused and the job
# runs. Open MPI's ports are pinned to one range for both jobs here (lowest free first), so that
# the second job's rank 1 takes the port the first job's lost rank 1 held every time.
source "$(dirname "$0")/common.sh"
: "${LOST_PEER:?set LOST_PEER to the lost_peer program (tests/slurm/lost_peer.c)}"
slurm_setup 2 240
CLUSTER2_DIR="$TEST_DIR/cluster2"
lose_pid="" late_pid=""
both_down() {
  local rc=$?
  set +e
  # shellcheck disable=SC2086  # one or two pids, or none
  kill -9 $lose_pid $late_pid 2> /dev/null  # (srun, whose cluster goes down)
  "$LOCAL_CLUSTER" down --dir "$CLUSTER2_DIR" > /dev/null 2>&1
  (exit "$rc")
  slurm_cleanup
}
trap both_down EXIT
"$LOCAL_CLUSTER" up --dir "$CLUSTER2_DIR" --nodes 2 --cpus-per-node 1 > /dev/null || fail "the second cluster did not come up"
conf1=$SLURM_CONF conf2="$CLUSTER2_DIR/etc/slurm.conf"
FAIL_LOGS+=("$CLUSTER2_DIR/log/slurmctld.log")

# Both jobs' ranks take their TCP port from the same 20 (Open MPI: the lowest free one).
port=$(free_port_pair) || fail "no free ports"
export OMPI_MCA_btl_tcp_port_min_v4=$port OMPI_MCA_btl_tcp_port_range_v4=20
listening() {  # listening N: N of lost_peer's ranks listen on a port of the range
  [[ $(ss -Htlnp "( sport >= :$port and sport < :$((port + 20)) )" 2> /dev/null | grep -c '"lost_peer"') == "$1" ]]
}
listening 0 || fail "ports $port.. are in use already"
wait_for() {  # wait_for SECONDS WHAT COMMAND...: until COMMAND succeeds
  local deadline=$((SECONDS + $1)) what=$2
  shift 2
  until "$@"; do ((SECONDS < deadline)) || fail "$what"; sleep 0.2; done
}
job_of() { SLURM_CONF=$1 squeue -h -o %i -n "$2" 2> /dev/null | head -1; }

# Cluster 1: rank 1 leaves after MPI_Init; rank 0 holds on until go1, then sends to it.
SLURM_CONF=$conf1 srun -J lose -N2 --ntasks-per-node=1 --mpi=pmix "$LOST_PEER" lose "$WORK/go1" > "$WORK/lose.out" 2>&1 &
lose_pid=$!
wait_for 60 "cluster 1's rank 1 did not start and leave" grep -q "task 1: Exited with exit code 3" "$WORK/lose.out"
wait_for 10 "the port of cluster 1's lost rank 1 is still open" listening 1
job1=$(job_of "$conf1" lose)
# Cluster 2: rank 1 waits in MPI_Init's exchange (its port open) until rank 0 starts, after go2.
SLURM_CONF=$conf2 srun -J late -N2 --ntasks-per-node=1 --mpi=pmix --wait=10 "$LOST_PEER" late "$WORK/go2" > "$WORK/late.out" 2>&1 &
late_pid=$!
wait_for 60 "cluster 2's rank 1 did not open its port" listening 2
job2=$(job_of "$conf2" late)
say "job $job1 of cluster 1 and job $job2 of cluster 2; ports from $port"
[[ -n "$job1" && -n "$job2" && "$job1" != "$job2" ]] || fail "the two clusters' jobs have the same id ($job1, $job2)"
# Cluster 1's rank 0 connects to its lost peer's port: cluster 2's rank 1 answers.
touch "$WORK/go1"
wait_for 30 "cluster 1's rank 0 did not send" grep -q "^sending" "$WORK/lose.out"
# Refused at once (Open MPI warns); taken, it waits for cluster 2's rank 0 to start and then
# crashes cluster 2's rank 1.
refused() { grep -q -i "cannot find a corresponding process" "$WORK/late.out"; }
for ((i = 0; i < 50; ++i)); do refused && break; sleep 0.2; done
touch "$WORK/go2"
rc=0
wait "$late_pid" || rc=$?
SLURM_CONF=$conf1 scancel "$job1" 2> /dev/null || true
wait "$lose_pid" 2> /dev/null || true
sed 's/^/    late: /' "$WORK/late.out"
((rc == 0)) || fail "cluster 2's job failed (srun exit $rc) after a connection from cluster 1's job"
grep -q "^ok 2$" "$WORK/late.out" || fail "cluster 2's job did not finish its allreduce"
refused || fail "cluster 1's connection did not reach cluster 2's rank 1 (no port taken over): nothing was tested"
say "PASS"

#!/usr/bin/env bash
# Which host a rank is on, when this machine is one of the hosts and -H lists it second: Open MPI
# puts rank 0 on its own host wherever -H lists it, so slot order ("rank 0 on the first host")
# would name the other host for everything rank 0 does. hpcrun reads where each rank went from
# mpirun's process map: rank 0, slowed down, is named a straggler on localhost (this machine's
# own name beside it), and when it is killed the failure is blamed on localhost, which is left out
# of the next attempt: the job finishes on host 1 alone. The same blame from the other form of map
# mpirun prints (--display-devel-map). And a rank that aborts on another host is blamed there, not
# on the host whose ranks were killed waiting for it.
source "$(dirname "$0")/common.sh"
netns_require
netns_setup 19 2
me=$(hostname)
# This machine's rank keeps its snapshots in host memory here, not in /dev/shm/hpctrain-$UID,
# which a failed run would leave to the tests that follow (host 1 has a /dev/shm of its own).
snapshots=/dev/shm/hpcrun-rank-hosts-test
rm -rf "$snapshots"
trap 'netns_cleanup; rm -rf "$snapshots"' EXIT
export TRAIN_EXTRA="--snapshot-dir $snapshots"

# 60 steps of 192 samples, a checkpoint every 10; rank 0 sleeps 250 ms after each of its steps.
export TRAIN_SAMPLES=11520
hpcrun_start mixed -H "${NETNS_HOSTS[1]}:1,localhost:1" -np 2 --min-np 1 --straggler-time 2s \
  -x HPCTRAIN_TEST_SLOW_RANK=0:250
wait_for_text mixed "is a straggler" 90
say "$(grep -o "host .* is a straggler.*" "$NETNS_DIR/mixed.err" | head -1)"
expect_in mixed "attempt 1: 2 rank(s) on ${NETNS_HOSTS[1]}:1,localhost:1"
expect_in mixed "host localhost ($me) is a straggler: its rank 0's steps take "

# Rank 0's process here (not in host 1's namespace), killed as a crash would end it.
victim=""
for p in $(pgrep -x hpctrain); do
  [[ -z "$(ip netns identify "$p" 2> /dev/null)" ]] && victim=$p
done
[[ -n "$victim" ]] || fail "no hpctrain process on this machine"
say "killing rank 0 (pid $victim) on this machine at step $(step_of mixed)"
kill -9 "$victim"
wait_for_text mixed "attempt 2:" 60
hpcrun_wait 120
[[ $RC == 0 ]] || fail "the job ended with $RC"
grep -E "attempt 1 (failed|ended)|blacklist|lost" "$NETNS_DIR/mixed.err" | head -5
expect_in mixed "attempt 2: 1 rank(s) on ${NETNS_HOSTS[1]}:1"
[[ -n "$(accuracy_of mixed)" ]] || fail "the job printed no final accuracy"

# The same from --display-devel-map's map, which has no closing line and names ranks otherwise:
# rank 0 dies after step 3, and localhost is blamed.
export TRAIN_SAMPLES=1920
NETNS_MPI_ARGS+=" --display-devel-map"
hpcrun_start devel -H "${NETNS_HOSTS[1]}:1,localhost:1" -np 2 --min-np 1 -x HPCTRAIN_TEST_KILL_AFTER_STEP=3@0 \
  --max-restarts 0
hpcrun_wait 120
expect_in devel "attempt 1 failed after .*: rank 0 on localhost ended with signal 9"
say "$(grep -o "attempt 1 failed.*" "$NETNS_DIR/devel.err" | head -1)"

# A rank that fails by itself on host 2 (MPI_Abort, exit code 3) while host 1's two ranks wait for
# it and are killed by mpirun's teardown before they can report: host 2 is blamed, not host 1 for
# its silence (their wrappers said the teardown reached them).
: "${ABORT_RANK:?set ABORT_RANK to the abort_rank test program}"
cp "$ABORT_RANK" "$NETNS_DIR/abort_rank"
timeout 120 "$HPCRUN" --launch-agent "$NETNS_AGENT" --mpi-args "$NETNS_MPI_ARGS" --log-dir "$NETNS_DIR/abort-logs" \
  -H "${NETNS_HOSTS[1]}:2,${NETNS_HOSTS[2]}:1" -np 3 --max-restarts 0 "$NETNS_DIR/abort_rank" \
  > "$NETNS_DIR/abort.out" 2> "$NETNS_DIR/abort.err" || true
say "$(grep -o "attempt 1 failed.*" "$NETNS_DIR/abort.err" | head -1)"
expect_in abort "attempt 1 failed after .*: rank 2 on ${NETNS_HOSTS[2]} ended with exit code 3"
expect_in abort "host ${NETNS_HOSTS[2]} blacklisted"
say "PASS"

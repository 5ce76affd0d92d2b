#!/usr/bin/env bash
# Which host a rank is on, when this machine is one of the hosts and -H lists it second: Open MPI
# puts rank 0 on its own host wherever -H lists it, so slot order ("rank 0 on the first host")
# would name the other host for everything rank 0 does. hpcrun reads where each rank went from
# mpirun's process map: rank 0, slowed down, is named a straggler on localhost (this machine's
# own name beside it), and when it is killed the failure is blamed on localhost, which is left out
# of the next attempt: the job finishes on host 1 alone.
source "$(dirname "$0")/common.sh"
netns_require
netns_setup 19 1
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
say "PASS"

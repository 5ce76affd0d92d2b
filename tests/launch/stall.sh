#!/usr/bin/env bash
# A hang that only the heartbeat shows: every process of host 3 is stopped (SIGSTOP) and the
# trainer's own step watchdog is off, so nothing exits. hpcrun sees no finished step for
# --stall-timeout, kills the job, blames the host whose ranks never reported, and relaunches
# without it. The start-up has its own limit (--start-timeout): on two cores with two busy
# processes beside it (CI runs two tests at once) the launch over ssh and the trainer's set-up
# took 11 to 15 s. The steps get 15 s: runs here under load once paused 6 s mid-run before the
# test stopped anything (rank 0 waits for the last checkpoint's write, synced to disk, when the
# next is due, and CI's other tests sync files too).
source "$(dirname "$0")/common.sh"
netns_require
netns_setup 15 3
export STEP_TIMEOUT=0

hpcrun_start stall -H "$(hpcrun_hosts "1 2 3")" -np 3 --min-np 2 --blacklist-cooldown 10m:20m \
  --stall-timeout 15s --start-timeout 2m --teardown-timeout 2s
wait_for_step stall 20 60
say "stopping every process of host 3"
stopped_at=$SECONDS
ip netns pids "hpt${NETNS_ID}h3" | xargs -r kill -STOP
expect_relaunch stall "$stopped_at"
hpcrun_wait 120
[[ $RC == 0 ]] || fail "the job ended with $RC"
expect_in stall "no step finished for 15 s (--stall-timeout"
# The healthy hosts' ranks answered the liveness query (SIGUSR2 through mpirun and the remote
# daemons), and it reached only the rank wrappers: no program died of it.
log="$NETNS_DIR/stall/hpcrun/attempt-1.log"
for r in 0 1; do grep -q "hpcrun-rank-alive: rank=$r" "$log" || fail "rank $r did not answer the liveness query"; done
! grep -q "signal=12" "$log" || fail "a rank died of hpcrun's liveness query (SIGUSR2): $(grep signal=12 "$log")"
expect_in stall "host ${NETNS_HOSTS[3]} blacklisted"
expect_in stall "attempt 2: 2 rank(s) on ${NETNS_HOSTS[1]}:1,${NETNS_HOSTS[2]}:1"
[[ -n "$(accuracy_of stall)" ]] || fail "the job printed no final accuracy"
expect_ssh_used stall 1 2 3
say "PASS"

#!/usr/bin/env bash
# Network cut: the link of rank 0's host goes down while its processes live on. Nothing hangs:
# the other ranks' step watchdogs fire (--step-timeout), hpcrun ends the job (mpirun cannot reach
# the cut host: --teardown-timeout) and relaunches without that host, and the job finishes.
source "$(dirname "$0")/common.sh"
netns_require
netns_setup 12 3
step_timeout=5
teardown=3
export STEP_TIMEOUT=${step_timeout}s

hpcrun_start cut -H "$(hpcrun_hosts "1 2 3")" -np 3 --min-np 2 --blacklist-cooldown 10m:20m \
  --teardown-timeout ${teardown}s --stall-timeout 20s --start-timeout 2m
wait_for_step cut 25 60
say "cutting host 1's link (rank 0)"
cut_at=$SECONDS
netns_cut_host 1
expect_relaunch cut "$cut_at"
hpcrun_wait 120
[[ $RC == 0 ]] || fail "the job ended with $RC"
expect_in cut "lost ${NETNS_HOSTS[1]}"
expect_in cut "attempt 2: 2 rank(s) on ${NETNS_HOSTS[2]}:1,${NETNS_HOSTS[3]}:1"
expect_in cut "summary: 2 attempt(s), 1 failure(s)"
[[ -n "$(accuracy_of cut)" ]] || fail "the job printed no final accuracy"
expect_ssh_used cut 1 2 3
say "PASS"

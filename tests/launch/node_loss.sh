#!/usr/bin/env bash
# Node loss: in a 3-host job every process of one host is SIGKILLed mid-training; hpcrun
# relaunches on the other two from the last checkpoint, and the job finishes within 0.5 points
# of an undisturbed run's accuracy. Then SIGTERM to hpcrun: checkpoint, stop, exit code 75.
source "$(dirname "$0")/common.sh"
netns_require
netns_setup 11 3

say "undisturbed run on 3 hosts"
hpcrun_start ref -H "$(hpcrun_hosts "1 2 3")" -np 3
hpcrun_wait 120; rc=$RC
[[ $rc == 0 ]] || fail "the undisturbed run ended with $rc"
ref=$(accuracy_of ref)
[[ -n "$ref" ]] || fail "no accuracy from the undisturbed run"
say "undisturbed: $ref%"

say "the same job; host 2 loses every process at step 25"
hpcrun_start lost -H "$(hpcrun_hosts "1 2 3")" -np 3 --min-np 2 --blacklist-cooldown 10m:20m
wait_for_step lost 25 60
netns_kill_host 2
hpcrun_wait 120; rc=$RC
[[ $rc == 0 ]] || fail "the job with a lost host ended with $rc"
got=$(accuracy_of lost)
say "with a lost host: $got% (undisturbed $ref%)"
expect_in lost "attempt 1 failed"
expect_in lost "lost ${NETNS_HOSTS[2]}"
expect_in lost "host ${NETNS_HOSTS[2]} blacklisted"
expect_in lost "attempt 2: 2 rank(s) on ${NETNS_HOSTS[1]}:1,${NETNS_HOSTS[3]}:1"
expect_in lost "summary: 2 attempt(s), 1 failure(s)"
expect_in lost "s from failure to the first step of attempt 2"
# Attempt 1 failed, and the time from its failure to attempt 2's first step is recorded.
python3 - "$NETNS_DIR/lost/hpcrun/summary.json" << 'PY' || fail "summary.json has no recovery time of attempt 1"
import json, sys
a = json.load(open(sys.argv[1]))["attempts"]
sys.exit(not (a[0]["result"] == "failure" and a[0]["recovery_seconds"] >= 0 and a[1]["result"] == "success"))
PY
awk -v a="$got" -v b="$ref" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.5) }' ||
  fail "accuracy $got% is more than 0.5 points from the undisturbed $ref%"
grep -q "resumed from" "$NETNS_DIR/lost.out" || grep -q "resum" "$NETNS_DIR/lost.out" || fail "attempt 2 did not resume"
expect_ssh_used lost 1 2 3

say "SIGTERM to hpcrun mid-run: the job checkpoints and stops, hpcrun exits 75"
hpcrun_start stop -H "$(hpcrun_hosts "1 3")" -np 2
wait_for_step stop 5 60
kill -TERM "$HPCRUN_PID"
hpcrun_wait 60; rc=$RC
[[ $rc == 75 ]] || fail "hpcrun ended with $rc after SIGTERM, not 75"
grep -q "state=stopped" "$NETNS_DIR/stop/heartbeat" || fail "the job did not stop with a checkpoint"
ls "$NETNS_DIR"/stop/ckpt-*.hpck > /dev/null || fail "no checkpoint after the stop"
say "PASS"

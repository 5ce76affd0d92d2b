#!/usr/bin/env bash
# Node loss: in a 3-host job every process of the first host (rank 0's, which writes the
# checkpoints) is SIGKILLed mid-training, and its memory (/dev/shm) goes with it; hpcrun
# relaunches on the other two, which resume from the snapshot in their own memory at most
# --snapshot-every-steps back (rank 1's, sent by it), not from the last checkpoint, and the job
# finishes within 0.5 points of an undisturbed run's accuracy. Then SIGTERM to hpcrun:
# checkpoint, stop, exit code 75.
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

say "the same job, snapshots every 3 steps (checkpoints every 10); host 1 loses every process at step 25"
K=3
TRAIN_EXTRA="--snapshot-every-steps $K" hpcrun_start lost -H "$(hpcrun_hosts "1 2 3")" -np 3 --min-np 2 \
  --blacklist-cooldown 10m:20m
wait_for_step lost 25 60
netns_kill_host 1
hpcrun_wait 120; rc=$RC
[[ $rc == 0 ]] || fail "the job with a lost host ended with $rc"
got=$(accuracy_of lost)
say "with a lost host: $got% (undisturbed $ref%)"
expect_in lost "attempt 1 failed"
expect_in lost "lost ${NETNS_HOSTS[1]}"
expect_in lost "host ${NETNS_HOSTS[1]} blacklisted"
expect_in lost "attempt 2: 2 rank(s) on ${NETNS_HOSTS[2]}:1,${NETNS_HOSTS[3]}:1"
expect_in lost "summary: 2 attempt(s), 1 failure(s)"
expect_in lost "s from failure to the first step of attempt 2"
expect_in lost "resumed from the \(snapshot\|checkpoint\) of step"
# Attempt 1 failed; the time from its failure to attempt 2's first step, the step attempt 2
# resumed from and where (a snapshot), and the work redone (at most K steps, as the heartbeat
# saw them) are recorded.
python3 - "$NETNS_DIR/lost/hpcrun/summary.json" "$K" << 'PY' || fail "summary.json: $(cat "$NETNS_DIR/lost/hpcrun/summary.json")"
import json, sys
a = json.load(open(sys.argv[1]))["attempts"]
k = int(sys.argv[2])
print("hpcrun summary:", {key: a[0].get(key) for key in ("last_step", "steps_redone", "seconds_lost", "recovery_seconds")},
      {key: a[1].get(key) for key in ("resumed_from", "resumed_from_step")})
# From a survivor's snapshot; or, where the host died right after a periodic checkpoint, from
# that checkpoint (the same state, which a tie gives to the checkpoint).
source_ok = a[1]["resumed_from"] == "snapshot" or (a[1]["resumed_from"] == "checkpoint" and a[1]["resumed_from_step"] % 10 == 0)
ok = (a[0]["result"] == "failure" and a[0]["recovery_seconds"] >= 0 and a[1]["result"] == "success"
      and source_ok and 0 <= a[0]["steps_redone"] <= k and a[0]["seconds_lost"] >= 0)
sys.exit(not ok)
PY
awk -v a="$got" -v b="$ref" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.5) }' ||
  fail "accuracy $got% is more than 0.5 points from the undisturbed $ref%"
grep -q "resumed from" "$NETNS_DIR/lost.out" || grep -q "resum" "$NETNS_DIR/lost.out" || fail "attempt 2 did not resume"
expect_ssh_used lost 1 2 3

say "SIGTERM to hpcrun mid-run: the job checkpoints and stops, hpcrun exits 75"
hpcrun_start stop -H "$(hpcrun_hosts "2 3")" -np 2
wait_for_step stop 5 60
kill -TERM "$HPCRUN_PID"
hpcrun_wait 60; rc=$RC
[[ $rc == 75 ]] || fail "hpcrun ended with $rc after SIGTERM, not 75"
grep -q "state=stopped" "$NETNS_DIR/stop/heartbeat" || fail "the job did not stop with a checkpoint"
ls "$NETNS_DIR"/stop/ckpt-*.hpck > /dev/null || fail "no checkpoint after the stop"
say "PASS"

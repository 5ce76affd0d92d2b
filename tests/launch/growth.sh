#!/usr/bin/env bash
# Growth and draining through --host-discovery-script: a host added to its output mid-run joins
# at the next relaunch (the job stops at a step boundary, then runs on 3 ranks); a host removed
# from it is drained the same way; slots added to a host in the job grow it as a new host does.
# None counts as a failure, and none writes a checkpoint: the hosts that go on hold the state in
# memory (snapshots), from which the next attempt continues at the very step of the stop.
source "$(dirname "$0")/common.sh"
netns_require
netns_setup 13 3
# 4 epochs (248 steps): on an idle machine the growth may stop attempt 1 as late as step 100 or
# so, and attempt 2 must still have 15 steps and a drain ahead of it (with 2 epochs it once
# finished first). A fifth epoch leaves attempt 3 as much ahead of it, for the slots' growth.
export EPOCHS=5

hosts_file="$NETNS_DIR/discovered"
printf '%s:1\n' "${NETNS_HOSTS[1]}" "${NETNS_HOSTS[2]}" > "$hosts_file"
discover="$NETNS_DIR/discover.sh"
printf '#!/bin/sh\ncat %s\n' "$hosts_file" > "$discover"
chmod +x "$discover"

hpcrun_start grow --host-discovery-script "$discover" --discovery-interval 1s --min-np 2 --max-np 3 --max-restarts 0
wait_for_step grow 15 60
say "adding host 3 to the discovery output"
printf '%s:1\n' "${NETNS_HOSTS[3]}" >> "$hosts_file"
wait_for_text grow "attempt 2: 3 rank(s)" 30
s=$(step_of grow)
wait_for_step grow $((s + 15)) 60
say "removing host 2 from the discovery output"
printf '%s:1\n' "${NETNS_HOSTS[1]}" "${NETNS_HOSTS[3]}" > "$hosts_file"
wait_for_text grow "attempt 3: 2 rank(s)" 30
s=$(step_of grow)
wait_for_step grow $((s + 15)) 60
say "giving host 3 two more slots in the discovery output, of which --max-np 3 takes one"
printf '%s:1\n%s:3\n' "${NETNS_HOSTS[1]}" "${NETNS_HOSTS[3]}" > "$hosts_file"
wait_for_text grow "attempt 4: 3 rank(s)" 30
hpcrun_wait 180
[[ $RC == 0 ]] || fail "the job ended with $RC"
expect_in grow "attempt 1: 2 rank(s) on ${NETNS_HOSTS[1]}:1,${NETNS_HOSTS[2]}:1"
expect_in grow "growing onto ${NETNS_HOSTS[3]}"
expect_in grow "attempt 2: 3 rank(s) on ${NETNS_HOSTS[1]}:1,${NETNS_HOSTS[2]}:1,${NETNS_HOSTS[3]}:1"
expect_in grow "host ${NETNS_HOSTS[2]} left the discovery output"
expect_in grow "attempt 3: 2 rank(s) on ${NETNS_HOSTS[1]}:1,${NETNS_HOSTS[3]}:1"
expect_in grow "growing onto 1 more slot(s) of host ${NETNS_HOSTS[3]}"
expect_in grow "attempt 4: 3 rank(s) on ${NETNS_HOSTS[1]}:1,${NETNS_HOSTS[3]}:2"
expect_in grow "summary: 4 attempt(s), 0 failure(s), 3 host change(s)"
[[ -n "$(accuracy_of grow)" ]] || fail "the job printed no final accuracy"
expect_ssh_used grow 1 2 3
# Attempts 2 to 4 resumed from the snapshot of the step where the one before stopped, which no
# checkpoint holds (checkpoints every 10 steps; the stop did not write one), unless that step
# was one of the periodic checkpoints'.
python3 - "$NETNS_DIR/grow" << 'PY' || fail "a change of hosts was not resumed from a snapshot at its stop step"
import json, os, sys
d = sys.argv[1]
a = json.load(open(os.path.join(d, "hpcrun", "summary.json")))["attempts"]
print("hpcrun summary:", [(x["attempt"], x["result"], x.get("resumed_from"), x.get("resumed_from_step"), x["last_step"]) for x in a])
for before, after in zip(a, a[1:]):
    s = after["resumed_from_step"]
    assert s >= before["last_step"], (s, before["last_step"])
    # At a multiple of 10 the periodic checkpoint holds the same state, and is taken first.
    assert after["resumed_from"] == "snapshot" or (s % 10 == 0 and after["resumed_from"] == "checkpoint"), after
    if s % 10 != 0:
        assert not os.path.exists(os.path.join(d, "ckpt-%09d.hpck" % s)), s
PY
grep -q "for hpcrun to change the hosts" "$NETNS_DIR/grow/hpcrun/attempt-1.log" ||
  fail "attempt 1 did not stop with snapshots only"
say "PASS"

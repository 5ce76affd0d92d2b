#!/usr/bin/env bash
# Node failure: one node's slurmd and its share of the job die (SIGKILL) mid-run. Slurm marks the
# node down, requeues the job (--requeue), and the job comes back on the nodes that remain (the
# third, idle until then, in place of the lost one). Rank 0's node n1 survived with the snapshot
# in its memory (each node here has a /dev/shm of its own), so the job continues from there, a
# step or so before the kill, not from its last periodic checkpoint (every 20 steps).
source "$(dirname "$0")/common.sh"
# After the node dies, Slurm ends the job on n1 too, whose rank waits for its lost peer and
# cannot checkpoint: it is killed KillWait after the node is marked down, and only then is the
# job requeued. 5 s instead of local-cluster.sh's 30 (a real cluster's), waited out for nothing.
HPCTRAIN_SLURM_KILL_WAIT=5 slurm_setup 3 400
[[ "$(scontrol show config | sed -n 's/^KillWait *= *//p')" == "5 sec" ]] ||
  fail "the cluster's KillWait is '$(scontrol show config | sed -n 's/^KillWait *= *//p')', not 5 sec"
# Long enough to be killed at step 70 and to go on after the resume; more steps would only
# train longer.
export TRAIN_SAMPLES=16000 EPOCHS=2  # 250 steps

submit lost --nodes=2 -- --checkpoint-every-steps 20 --checkpoint-interval 0 --snapshot-every-steps 1
wait_state "$JOB" RUNNING 60
[[ "$(job_field "$JOB" NodeList)" == "n[1-2]" ]] || fail "the job started on $(job_field "$JOB" NodeList), not both nodes"
wait_step lost 70 90
kill_step=$(step_of lost)
say "at step $kill_step: killing node n2"
"$LOCAL_CLUSTER" kill-node n2 --dir "$CLUSTER_DIR"
killed_at=$SECONDS
wait_restarts "$JOB" 1 120
say "Slurm requeued the job $((SECONDS - killed_at)) s after the node died: n2 is $(sinfo -h -n n2 -o %T)"
deadline=$((SECONDS + 90))
until grep -q "resuming from" "$WORK/lost.out"; do ((SECONDS < deadline)) || fail "the job did not resume"; sleep 0.5; done
say "resumed $((SECONDS - killed_at)) s after the node died"
wait_state "$JOB" COMPLETED 200

resumed=$(resumed_steps lost)
say "resumed at step $resumed; second run: $(grep -o 'restart 1): on [^;]*' "$WORK/lost.out" | head -1)"
read -r r1 rest <<< "$resumed"
[[ -n "$r1" && -z "$rest" ]] || fail "expected one resume, saw '$resumed'"
((r1 >= kill_step)) || fail "resumed at step $r1, before step $kill_step where the node died"
# From n1's snapshot, unless the node died right after a periodic checkpoint (the same state).
((r1 % 20 == 0)) || grep -q "the newest state is a snapshot in host memory" "$WORK/lost.out" ||
  fail "resumed at step $r1, but not from the snapshot in n1's memory"
expect_out lost "restart 1): on n\[1,3\] (2 node(s), 2 task(s))"
[[ "$(done_field lost steps)" == 250 ]] || fail "$(done_field lost steps) steps, not 250"
say "PASS"

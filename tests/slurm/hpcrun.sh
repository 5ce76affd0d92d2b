#!/usr/bin/env bash
# LAUNCHER=hpcrun in an allocation submitted with --no-kill: when a node dies, Slurm keeps the
# job, and hpcrun relaunches the training on the remaining node from its last checkpoint within
# seconds, with no requeue (hpcrun's mpirun starts its daemons with srun on the healthy nodes).
source "$(dirname "$0")/common.sh"
slurm_setup 2 300
export TRAIN_SAMPLES=16000 EPOCHS=4  # 500 steps

LAUNCHER=hpcrun LAUNCHER_ARGS="--min-np 1" submit inside --nodes=2 --no-kill -- \
  --checkpoint-every-steps 20 --checkpoint-interval 0
wait_state "$JOB" RUNNING 60
wait_step inside 60 90
say "at step $(step_of inside): killing node n2"
"$LOCAL_CLUSTER" kill-node n2 --dir "$CLUSTER_DIR"
wait_state "$JOB" COMPLETED 200
out_of inside | grep '^hpcrun:' | sed 's/^/    /'
[[ "$(job_field "$JOB" Restarts)" == 0 ]] || fail "the job was requeued: hpcrun did not recover inside it"
expect_out inside "hpcrun: attempt 1 failed after .*: lost n2"
expect_out inside "hpcrun: attempt 2: 1 rank(s) on n1:1"
expect_out inside "hpcrun: attempt 2 succeeded"
[[ "$(done_field inside steps)" == 500 ]] || fail "$(done_field inside steps) steps, not 500"
[[ "$(done_field inside world_size)" == 1 ]] || fail "finished on $(done_field inside world_size) ranks, not 1"
# Attempt 1 failed, and the time from its failure to attempt 2's first step is recorded.
python3 - "$WORK/inside/hpcrun/summary.json" << 'PY' || fail "no summary.json with the recovery time of attempt 1"
import json, sys
a = json.load(open(sys.argv[1]))["attempts"]
sys.exit(not (a[0]["result"] == "failure" and a[0]["recovery_seconds"] >= 0 and a[1]["result"] == "success"))
PY
say "PASS"

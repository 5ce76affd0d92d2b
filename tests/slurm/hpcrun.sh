#!/usr/bin/env bash
# LAUNCHER=hpcrun in an allocation submitted with --no-kill: when a node dies, Slurm keeps the
# job, and hpcrun relaunches the training on the remaining node from its last checkpoint within
# seconds, with no requeue (hpcrun's mpirun starts its daemons with srun on the healthy nodes).
# And when Slurm itself preempts such a job (a job of a higher-priority partition takes the nodes:
# Slurm signals every step, mpirun's daemons too, which looks like lost hosts), hpcrun does not
# relaunch into the allocation Slurm is taking back: it exits 75, the script requeues the job,
# and it resumes from its last checkpoint once the nodes are free again.
source "$(dirname "$0")/common.sh"
CLUSTER_ARGS="--preemption 30" slurm_setup 2 420
# Long enough for each fault at step 60 to come well before the end, and to go on after it;
# more steps would only train longer (the rest on one rank, after the node loss).
export TRAIN_SAMPLES=16000 EPOCHS=2  # 250 steps

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
[[ "$(done_field inside steps)" == 250 ]] || fail "$(done_field inside steps) steps, not 250"
[[ "$(done_field inside world_size)" == 1 ]] || fail "finished on $(done_field inside world_size) ranks, not 1"
# Attempt 1 failed, and the time from its failure to attempt 2's first step is recorded.
python3 - "$WORK/inside/hpcrun/summary.json" << 'PY' || fail "no summary.json with the recovery time of attempt 1"
import json, sys
a = json.load(open(sys.argv[1]))["attempts"]
sys.exit(not (a[0]["result"] == "failure" and a[0]["recovery_seconds"] >= 0 and a[1]["result"] == "success"))
PY
say "node loss: relaunched inside the allocation"

"$LOCAL_CLUSTER" start-node n2 --dir "$CLUSTER_DIR" > /dev/null
LAUNCHER=hpcrun submit preempted --nodes=2 -- --checkpoint-every-steps 20 --checkpoint-interval 0
wait_state "$JOB" RUNNING 60
wait_step preempted 60 90
say "at step $(step_of preempted): a job on partition high needs both nodes"
high=$(sbatch --parsable -p high -N 2 --ntasks-per-node=1 --cpus-per-task=1 -o "$WORK/high.out" --wrap 'echo high ran') ||
  fail "sbatch -p high refused the job"
wait_state "$high" COMPLETED 120
wait_restarts "$JOB" 1 60
wait_state "$JOB" COMPLETED 200
out_of preempted | grep '^hpcrun:' | sed 's/^/    /'
expect_out preempted "hpcrun: Slurm chose this job for preemption at .*: not a host failure, nothing relaunched"
expect_out preempted "hpcrun exited 75\|(exit 75); requeueing"
! grep -q "relaunching from\|blacklisted" "$WORK/preempted.out" ||
  fail "hpcrun took Slurm's preemption for a host failure"
resumed=$(resumed_steps preempted)
# From a periodic checkpoint, or from the stop's own when rank 0 wrote it on Slurm's SIGTERM
# before mpirun's daemons ended the ranks.
[[ "$resumed" =~ ^[0-9]+\ $ && ${resumed% } -ge 60 ]] ||
  fail "the requeued run resumed at '$resumed', not once, from a checkpoint of step 60 or later"
[[ "$(done_field preempted steps)" == 250 && "$(done_field preempted world_size)" == 2 ]] ||
  fail "$(done_field preempted steps) steps on $(done_field preempted world_size) ranks, not 250 on 2"
say "preemption: requeued once, resumed at step ${resumed% } on both nodes"
say "PASS"

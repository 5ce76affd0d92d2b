#!/usr/bin/env bash
# sbatch slurm/train.sbatch on 2 nodes of a real Slurm runs the training to completion, with the
# expected accuracy and its outputs where the script promises them, through srun and through
# mpirun alike; a usage error fails the job at once (exit 2) instead of requeueing it. The two
# nodes are separate network namespaces with their own addresses (local-cluster.sh --netns), so
# srun's PMIx wire-up and the ranks' MPI traffic cross a network path, as between real nodes.
source "$(dirname "$0")/common.sh"
CLUSTER_ARGS=--netns slurm_setup 2 240

# ranks_by_namespace NAME: "namespace:count" of the running hpctrain processes of this test's job
# NAME (its checkpoint directory is on their command line; other tests' hpctrain may run beside
# them), e.g. "hpcs1n1:1 hpcs1n2:1"; a process in no named namespace counts as "-".
ranks_by_namespace() {
  local p ns
  for p in $(pgrep -x -f "$HPCTRAIN .*--checkpoint-dir $WORK/$1 .*"); do
    ns=$(ip netns identify "$p" 2> /dev/null) || true
    echo "${ns:--}"
  done | sort | uniq -c | awk '{printf "%s%s:%s", (NR > 1 ? " " : ""), $2, $1}'
}

EPOCHS=2 submit run --nodes=2
wait_step run 5 60
placed=$(ranks_by_namespace run)
[[ "$placed" =~ ^hpcs[0-9]+n1:1\ hpcs[0-9]+n2:1$ ]] || fail "the ranks ran in namespaces '$placed', not one in each node's"
say "srun: one rank in each node's network namespace ($placed)"
wait_state "$JOB" COMPLETED 180
say "job $JOB completed"
[[ "$(job_field "$JOB" Restarts)" == 0 ]] || fail "the job was requeued"
[[ "$(job_field "$JOB" ExitCode)" == 0:0 ]] || fail "exit code $(job_field "$JOB" ExitCode)"
expect_out run "restart 0): on n\[1-2\] (2 node(s), 2 task(s)), SLURM_RESTART_COUNT=0"
expect_out run "2 rank(s), global batch 128"
expect_out run "the training finished"
acc=$(done_field run test_accuracy)
say "test accuracy $acc, $(done_field run steps) steps"
[[ "$(done_field run steps)" == 124 ]] || fail "$(done_field run steps) steps, not 124"
awk -v a="$acc" 'BEGIN { exit !(a >= 0.80) }' || fail "test accuracy $acc below 0.80"
ls "$WORK/run"/ckpt-*.hpck > /dev/null 2>&1 || fail "no checkpoint in the checkpoint directory"

# The same job launched by Open MPI's mpirun inside the allocation trains the same parameters.
LAUNCHER=mpirun EPOCHS=2 submit viampirun --nodes=2
wait_state "$JOB" COMPLETED 180
expect_out viampirun "mpirun --bind-to none"
[[ "$(done_field viampirun param_checksum)" == "$(done_field run param_checksum)" ]] ||
  fail "LAUNCHER=mpirun: param checksum $(done_field viampirun param_checksum), srun: $(done_field run param_checksum)"
say "LAUNCHER=mpirun: the same parameters as srun's"
# The job outputs are logs: no carriage return or escape (mpirun gives rank 0 a pseudo-terminal,
# which must not be taken for a person's), and hpctrain's lines start with the UTC time.
for name in run viampirun; do
  ! grep -q $'[\r\e]' "$WORK/$name.out" || fail "$name's output holds carriage returns or escapes"
  grep -Eq '^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z hpctrain(\[0\])?: epoch 1/2  step 10/' \
    "$WORK/$name.out" || fail "$name's progress lines are not stamped with the time"
done
say "srun and mpirun: plain progress lines with timestamps"

# A usage error: the trainer exits 2 and the job fails at once, never requeued.
submit bad --nodes=2 -- --lr-schedule sideways
wait_state "$JOB" FAILED 60
[[ "$(job_field "$JOB" ExitCode)" == 2:0 ]] || fail "exit code $(job_field "$JOB" ExitCode), not 2:0"
[[ "$(job_field "$JOB" Restarts)" == 0 ]] || fail "a usage error was requeued"
expect_out bad "usage error (exit 2): not requeued"
say "PASS"

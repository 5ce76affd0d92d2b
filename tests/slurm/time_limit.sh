#!/usr/bin/env bash
# A job whose time limit (1 minute, Slurm's least) is shorter than its training: the warning
# signal comes before the limit (--signal=B:USR1@15), the trainer checkpoints, the script requeues
# the job, and the training finishes over several segments, none of them killed by the limit.
source "$(dirname "$0")/common.sh"
slurm_setup 2 400
# About 50 s of training on a 2-core VM (22 steps a second): more than one segment can hold. A
# segment runs at most 45 s: slurmctld checks the limits every 30 s and sends the signal at the
# first check that finds under 15 + 30 s left (Slurm's manual: up to a minute early). Each requeue
# costs about 12 s more (the 10 s a requeued job waits, local-cluster.sh).
export TRAIN_SAMPLES=20000 EPOCHS=7  # 1092 steps

submit segments --nodes=2 --time=1 --signal=B:USR1@15 -- --checkpoint-interval 0
wait_state "$JOB" COMPLETED 330
restarts=$(job_field "$JOB" Restarts)
resumed=$(resumed_steps segments)
stops=$(stopped_steps segments)
say "completed after $restarts requeue(s); stopped after steps: $stops; resumed at: $resumed"
((restarts >= 1)) || fail "the job finished in one segment: the test's training is too short"
[[ "$resumed" == "$stops" ]] || fail "the runs resumed at '$resumed', not where they stopped ('$stops')"
[[ $(wc -w <<< "$stops") == "$restarts" ]] || fail "$restarts requeues but $(wc -w <<< "$stops") checkpointed stops"
grep -q "DUE TO TIME LIMIT" "$WORK/segments.out" && fail "a segment was killed by the time limit"
# Every segment that was requeued ended on the warning signal. (The last one may get the signal
# too, if slurmctld's check falls in the moment between the training's end and the script's.)
for ((r = 0; r < restarts; r++)); do
  grep -q "job $JOB (restart $r): SIGUSR1: asking the trainer" "$WORK/segments.out" ||
    fail "segment $r (restart $r) did not end on the warning signal"
done
[[ "$(done_field segments steps)" == 1092 ]] || fail "$(done_field segments steps) steps, not 1092"
expect_out segments "job $JOB (restart $restarts)"
say "PASS"

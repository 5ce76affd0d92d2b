#!/usr/bin/env bash
# A job whose time limit (1 minute, Slurm's least) is shorter than its training: the warning
# signal comes before the limit (--signal=B:USR1@15), the trainer checkpoints, the script requeues
# the job, and the training finishes over several segments, none of them killed by the limit.
# Beside it on a third node, a job whose warning never comes (--signal=B:URG@15, a signal the
# script ignores, stands for one that came too late): Slurm ends it at its limit with SIGTERM,
# sent twice to each task (once by Slurm, once passed on by srun), and it carries on all the same.
# The trainer took the second SIGTERM for "stop at once" and dropped its checkpoint, and the
# script left a job that Slurm was ending (COMPLETING) as it was: the training ended there.
source "$(dirname "$0")/common.sh"
slurm_setup 3 470  # (CTest gives it 480)
# More training than one segment can hold, on any machine: a segment runs at most 45 s (slurmctld
# checks the limits every 30 s and sends the signal at the first check that finds under 15 + 30 s
# left; Slurm's manual: up to a minute early). 546 steps, each at least 80 ms (rank 0 sleeps that
# long in each, HPCTRAIN_TEST_SLOW_RANK, and rank 1 waits for it): 44 s of sleep, plus 12-25 s
# of work on a 2-core VM. (The work alone, 1092 steps, once took 50 s; on a faster day 28 s,
# and the job finished before the warning came.) Each requeue costs about 12 s more (the 10 s a
# requeued job waits, local-cluster.sh).
export TRAIN_SAMPLES=10000 EPOCHS=7 HPCTRAIN_TEST_SLOW_RANK=0:80  # 546 steps

submit segments --nodes=2 --time=1 --signal=B:USR1@15 -- --checkpoint-interval 0
SEGMENTS=$JOB
# 624 steps on one rank, each at least 150 ms: 94 s of sleep, past the limit on any machine, and
# half the work of 80 ms steps to take from the other job's cores.
EPOCHS=8 HPCTRAIN_TEST_SLOW_RANK=0:150 submit late --nodes=1 --time=1 --signal=B:URG@15 -- --checkpoint-interval 0
LATE=$JOB JOB=$SEGMENTS
wait_state "$JOB" COMPLETED $((455 - SECONDS))
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
[[ "$(done_field segments steps)" == 546 ]] || fail "$(done_field segments steps) steps, not 546"
expect_out segments "job $JOB (restart $restarts)"

JOB=$LATE
# Its last segment may itself outrun the limit by less than slurmctld's 30 s between checks: the
# training then finishes, and Slurm calls the job TIMEOUT all the same. Done is what counts.
while [[ "$(done_field late steps)" != 624 || ! "$(job_field "$JOB" JobState)" =~ ^(COMPLETED|TIMEOUT)$ ]]; do
  ((SECONDS < 460)) || fail "the job without a warning is $(job_field "$JOB" JobState), its training unfinished"
  sleep 0.5
done
restarts=$(job_field "$JOB" Restarts)
resumed=$(resumed_steps late)
stops=$(stopped_steps late)
say "the job without a warning completed after $restarts requeue(s); stopped after steps: $stops; resumed at: $resumed"
grep -q "DUE TO TIME LIMIT" "$WORK/late.out" || fail "the job without a warning was not ended by its time limit"
grep -q "stopped at once" "$WORK/late.out" && fail "a SIGTERM at the time limit stopped the trainer at once"
((restarts >= 1)) && [[ -n "$stops" && "$resumed" == "$stops" ]] ||
  fail "$restarts requeue(s), the runs resumed at '$resumed', not where they stopped ('$stops')"
expect_out late "the job reached its time limit in Slurm"
[[ "$(done_field late steps)" == 624 ]] || fail "$(done_field late steps) steps, not 624"
say "PASS"

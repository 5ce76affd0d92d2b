#!/usr/bin/env bash
# Preemption, both ways a site does it: the warning signal (scancel --signal=USR1 --batch, as
# --signal=B:USR1@N sends before a time limit) and Slurm's own preemption (a cluster with
# PreemptType=preempt/partition_prio, PreemptMode=REQUEUE and a GraceTime: a job submitted to the
# high-priority partition takes the nodes, Slurm sends the training's tasks SIGTERM and kills them
# after the grace time). Each time the job checkpoints, is requeued, and resumes from its
# checkpoint (the step goes on, not back to 0), and it ends with exactly the parameters of a run
# never interrupted.
source "$(dirname "$0")/common.sh"
CLUSTER_ARGS="--preemption 30" slurm_setup 2 300
# Long enough for both interruptions (at step 40, then 40 steps after the first resume) to come
# well before the end; more steps would only train longer, twice (the reference run too).
export TRAIN_SAMPLES=16000 EPOCHS=3  # 375 steps
# No periodic checkpoints: a resume from step > 0 can only come from the signal's checkpoint.
periodic=(--checkpoint-interval 0)

submit reference --nodes=2 -- "${periodic[@]}"
wait_state "$JOB" COMPLETED 150
want=$(done_field reference param_checksum)
say "uninterrupted: param checksum $want"

submit preempted --nodes=2 -- "${periodic[@]}"
wait_state "$JOB" RUNNING 60
wait_step preempted 40 60
say "at step $(step_of preempted): scancel --signal=USR1 --batch"
scancel --signal=USR1 --batch "$JOB"
wait_restarts "$JOB" 1 60
expect_out preempted "SIGUSR1: asking the trainer to checkpoint and stop"
expect_out preempted "the trainer checkpointed and stopped (exit 75); requeueing"
stop1=$(stopped_steps preempted)
stop1=${stop1% }
stop1=${stop1##* }  # the last one
say "requeued after a checkpoint at step $stop1"

wait_state "$JOB" RUNNING 60
wait_step preempted $((stop1 + 40)) 90
say "at step $(step_of preempted): a job on partition high needs both nodes"
scontrol setdebug debug  # for the preemption's line in slurmctld's log
high=$(sbatch --parsable -p high -N 2 --ntasks-per-node=1 --cpus-per-task=1 -o "$WORK/high.out" \
  --wrap 'echo "high ran at $(date +%s.%N)"') || fail "sbatch -p high refused the job"
wait_state "$high" COMPLETED 90
wait_restarts "$JOB" 2 60
expect_out preempted "stopped on request (SIGTERM"
# slurmctld logs (at level debug) the job it chose to preempt and the grace time it gave it.
grep -q "preemption grace time for JobId=$JOB to reclaim resources for JobId=$high" "$CLUSTER_DIR/log/slurmctld.log" ||
  fail "slurmctld's log does not show job $JOB preempted for job $high"
say "Slurm preempted job $JOB for job $high, which ran: $(cat "$WORK/high.out")"
wait_state "$JOB" COMPLETED 150

resumed=$(resumed_steps preempted)
stops=$(stopped_steps preempted)
say "stopped after steps: $stops; runs resumed at steps: $resumed"
[[ "$resumed" == "$stops" ]] || fail "the runs resumed at '$resumed', not where they stopped ('$stops')"
read -r r1 r2 rest <<< "$resumed"
[[ -n "$r2" && -z "$rest" ]] || fail "expected two resumes, saw '$resumed'"
((r1 >= 40 && r2 > r1)) || fail "resumes at $r1 then $r2: the step did not go on"
expect_out preempted "job $JOB (restart 2)"
[[ "$(done_field preempted steps)" == 375 ]] || fail "$(done_field preempted steps) steps, not 375"
got=$(done_field preempted param_checksum)
[[ "$got" == "$want" ]] || fail "param checksum $got after two preemptions, $want uninterrupted"
say "PASS: param checksum $got equals the uninterrupted run's"

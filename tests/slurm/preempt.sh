#!/usr/bin/env bash
# Preemption, both ways a site does it: the warning signal (scancel --signal=USR1 --batch, as
# --signal=B:USR1@N sends before a time limit) and `scontrol requeue` (SIGTERM to every task).
# Each time the job checkpoints, is requeued, and resumes from its checkpoint (the step goes on,
# not back to 0), and it ends with exactly the parameters of a run never interrupted.
source "$(dirname "$0")/common.sh"
slurm_setup 2 300
export TRAIN_SAMPLES=16000 EPOCHS=4  # 500 steps
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
say "at step $(step_of preempted): scontrol requeue"
scontrol requeue "$JOB"
wait_restarts "$JOB" 2 60
wait_state "$JOB" COMPLETED 150

resumed=$(resumed_steps preempted)
stops=$(stopped_steps preempted)
say "stopped after steps: $stops; runs resumed at steps: $resumed"
[[ "$resumed" == "$stops" ]] || fail "the runs resumed at '$resumed', not where they stopped ('$stops')"
read -r r1 r2 rest <<< "$resumed"
[[ -n "$r2" && -z "$rest" ]] || fail "expected two resumes, saw '$resumed'"
((r1 >= 40 && r2 > r1)) || fail "resumes at $r1 then $r2: the step did not go on"
expect_out preempted "job $JOB (restart 2)"
[[ "$(done_field preempted steps)" == 500 ]] || fail "$(done_field preempted steps) steps, not 500"
got=$(done_field preempted param_checksum)
[[ "$got" == "$want" ]] || fail "param checksum $got after two preemptions, $want uninterrupted"
say "PASS: param checksum $got equals the uninterrupted run's"

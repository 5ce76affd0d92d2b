#!/usr/bin/env bash
# slurm/chain.sh, for sites without requeue: four dependent segments (afterany) on one checkpoint
# directory. The first two are stopped by the warning signal (as a time limit does), checkpoint
# and end without requeueing themselves; the next segment resumes where each stopped; the third
# finishes the training and the fourth, starting after that, only evaluates the final checkpoint.
source "$(dirname "$0")/common.sh"
slurm_setup 2 300
export TRAIN_SAMPLES=16000 EPOCHS=4  # 500 steps

# shellcheck disable=SC2046
CHECKPOINT_DIR="$WORK/chain" "$repo/slurm/chain.sh" 4 --nodes=2 "${LOCAL_FIT[@]}" --output="$WORK/chain-%j.out" \
  -- $(train_args) --checkpoint-interval 0 > "$WORK/chain.log" || fail "chain.sh failed: $(cat "$WORK/chain.log")"
mapfile -t seg < <(sed -n 's/^segment [0-9]*: job //p' "$WORK/chain.log")
say "segments: ${seg[*]}"
((${#seg[@]} == 4)) || fail "chain.sh printed ${#seg[@]} segments, not 4"
[[ "$(job_field "${seg[1]}" Dependency)" == "afterany:${seg[0]}"* ]] ||
  fail "segment 2 depends on '$(job_field "${seg[1]}" Dependency)', not afterany:${seg[0]}"

stop=0
for k in 0 1; do
  wait_state "${seg[k]}" RUNNING 90
  wait_step chain $((stop + 60)) 90
  say "segment $((k + 1)) at step $(step_of chain): scancel --signal=USR1 --batch"
  scancel --signal=USR1 --batch "${seg[k]}"
  wait_state "${seg[k]}" FAILED 60
  [[ "$(job_field "${seg[k]}" ExitCode)" == 75:0 ]] || fail "segment $((k + 1)) exit code $(job_field "${seg[k]}" ExitCode), not 75"
  [[ "$(job_field "${seg[k]}" Restarts)" == 0 ]] || fail "segment $((k + 1)) was requeued"
  stop=$(sed -n 's/^step=//p' "$WORK/chain/heartbeat")
done
wait_state "${seg[2]}" COMPLETED 120
wait_state "${seg[3]}" COMPLETED 60

cat "$WORK"/chain-"${seg[0]}".out "$WORK"/chain-"${seg[1]}".out "$WORK"/chain-"${seg[2]}".out \
  "$WORK"/chain-"${seg[3]}".out > "$WORK/all.out"
resumed=$(resumed_steps all)
stops=$(stopped_steps all)
say "stopped after steps: $stops; segments resumed at: $resumed"
[[ "$resumed" == "${stops}500 " ]] || fail "segments resumed at '$resumed', not at '$stops' and then 500"
grep -q "REQUEUE=0" "$WORK/all.out" || fail "no segment said it was not requeued"
grep -q "nothing to train" "$WORK/chain-${seg[3]}.out" || fail "the last segment trained again"
[[ "$(grep -c '"event":"done"' "$WORK/chain/metrics.jsonl")" == 2 ]] || fail "not two done events (finish, then evaluation)"
[[ "$(done_field chain steps)" == 500 ]] || fail "$(done_field chain steps) steps, not 500"
say "PASS"

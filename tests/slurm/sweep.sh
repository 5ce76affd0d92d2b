#!/usr/bin/env bash
# slurm/sweep.sbatch as a job array over a 2 x 2 grid: all four tasks run (two at a time on the two
# nodes), each with its own point of the grid, checkpoint directory and metrics file. A task
# outside the grid fails with the reason, not requeued.
source "$(dirname "$0")/common.sh"
slurm_setup 2 240

export SWEEP="lr=0.05,0.2 batch-size=32,64" SWEEP_DIR="$WORK/sweep"
# shellcheck disable=SC2046
array=$(sbatch --parsable --array=0-4 --output="$WORK/sweep-%a.out" "${LOCAL_FIT[@]}" \
  "$repo/slurm/sweep.sbatch" --device cpu --data-dir "$FASHION_MNIST" --train-samples 2000 \
  --test-samples 500 --epochs 1) || fail "sbatch refused the sweep"
say "submitted the sweep as array job $array"

deadline=$((SECONDS + 150))
until [[ -z "$(squeue -h -j "$array" 2> /dev/null)" ]]; do
  ((SECONDS < deadline)) || fail "the sweep's tasks still queued or running after 150 s"
  sleep 1
done
want=("lr=0.05_batch-size=32" "lr=0.05_batch-size=64" "lr=0.2_batch-size=32" "lr=0.2_batch-size=64")
for i in 0 1 2 3; do
  [[ "$(job_field "${array}_$i" JobState)" == COMPLETED ]] || fail "task $i is $(job_field "${array}_$i" JobState)"
  d="$SWEEP_DIR/task-${i}_${want[i]}"
  grep -q '"event":"done"' "$d/metrics.jsonl" 2> /dev/null || fail "task $i: no finished metrics in $d"
  ls "$d"/ckpt-*.hpck > /dev/null 2>&1 || fail "task $i: no checkpoint in $d"
  lr=${want[i]#lr=}
  lr=${lr%%_*}
  bs=${want[i]##*=}
  grep -q -- "--lr $lr --batch-size $bs\$" "$WORK/sweep-$i.out" || fail "task $i did not run with --lr $lr --batch-size $bs"
  say "task $i: ${want[i]}: test accuracy $(grep -o '"test_accuracy":[0-9.]*' "$d/metrics.jsonl" | tail -1 | cut -d: -f2)"
done
[[ $(find "$SWEEP_DIR" -name metrics.jsonl | wc -l) == 4 ]] || fail "not four metrics files"
[[ "$(job_field "${array}_4" JobState)" == FAILED && "$(job_field "${array}_4" ExitCode)" == 2:0 ]] ||
  fail "task 4, outside the grid, ended $(job_field "${array}_4" JobState) $(job_field "${array}_4" ExitCode)"
grep -q "outside the sweep's 4 point(s)" "$WORK/sweep-4.out" || fail "task 4 did not say why it failed"
say "PASS"

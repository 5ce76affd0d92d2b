#!/usr/bin/env bash
# What keeping the state costs the step loop, on the CPU: snapshots in host memory every step
# and every 10 steps, beside checkpoints to disk every step and every 10 steps, for cnn
# (Fashion-MNIST) and resnet18 (synthetic 64x64 images). Each variant is one run of the same
# steps; printed per variant: the step time, the step-loop stall (snapshot_stall_seconds or
# checkpoint_stall_seconds of the done line) per step, and that stall as a share of the run's
# own step time (target: snapshots every step under 2% for cnn); the step time of a run that
# keeps nothing is printed beside them.
# Usage: bench/snapshot_cost.sh [--steps N] [--threads T] [--models M,...]
#        (defaults: 300 steps, all cores, cnn,resnet18)
# Environment: BUILD_DIR (default build), HPCTRAIN, FASHION_MNIST, SNAPSHOT_DIR (default /dev/shm).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
build_paths
hpctrain=$HPCTRAIN
fashion=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
steps=300 threads=0 models=cnn,resnet18
while (($#)); do
  case "$1" in
    --steps) [[ $# -ge 2 ]] || die "--steps needs a value"; steps=$2; shift 2 ;;
    --threads) [[ $# -ge 2 ]] || die "--threads needs a value"; threads=$2; shift 2 ;;
    --models) [[ $# -ge 2 ]] || die "--models needs a value"; models=$2; shift 2 ;;
    -h | --help) sed -n '2,11s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) die "unknown option '$1'" ;;
  esac
done
require_count --steps "$steps"
[[ "$threads" =~ ^[0-9]+$ ]] || die "--threads must be a count, got '$threads'"
[[ "$models" =~ ^(cnn|resnet18)(,(cnn|resnet18))*$ ]] || die "--models takes cnn and resnet18, comma-separated, got '$models'"
[[ -x "$hpctrain" ]] || die "no hpctrain binary at $hpctrain (run ./setup.sh, or set BUILD_DIR or HPCTRAIN)"
work=$(mktemp -d /tmp/snapshot-cost-XXXXXX)
snaps=$(mktemp -d "${SNAPSHOT_DIR:-/dev/shm}/snapshot-cost-XXXXXX")
trap 'rm -rf "$work" "$snaps"' EXIT

# run NAME MODEL_ARGS... -- KEEP_ARGS...: the done line's step time and stall per step.
run() {
  local name=$1; shift
  local model=() keep=()
  while (($#)) && [[ "$1" != -- ]]; do model+=("$1"); shift; done
  shift
  keep=("$@")
  rm -rf "$work/ck"
  "$hpctrain" --device cpu --threads "$threads" --quiet --max-steps "$steps" --epochs 100 "${model[@]}" \
    --metrics-file "$work/$name.jsonl" "${keep[@]}" > /dev/null
  local d step snap ck
  d=$(tail -n 1 "$work/$name.jsonl")
  step=$(json_number step_seconds <<< "$d")
  snap=$(json_number snapshot_stall_seconds <<< "$d")
  ck=$(json_number checkpoint_stall_seconds <<< "$d")
  echo "$step ${snap:-0} ${ck:-0}"
}

cpu=$(cpu_model) isa=$(cpu_isa)
echo "state-keeping cost, $steps steps each, on $(nproc) cores ($cpu, $isa), snapshots in $snaps:"
printf '%-10s %-34s %12s %14s %10s\n' model variant "step (ms)" "stall/step" "of step"
for model in ${models//,/ }; do
  if [[ $model == cnn ]]; then
    margs=(--model cnn --data-dir "$fashion")
  else
    margs=(--model resnet18 --dataset synthetic --image-size 64 --batch-size 32)
  fi
  read -r base _ _ < <(run "$model-none" "${margs[@]}" --)
  printf '%-10s %-34s %12.2f %14s %10s\n' "$model" "nothing kept" "$(calc "$base * 1000" 2)" - -
  for variant in "snapshots every step:1:snap" "snapshots every 10 steps:10:snap" \
    "checkpoints to disk every step:1:ck" "checkpoints to disk every 10 steps:10:ck"; do
    IFS=: read -r label every kind <<< "$variant"
    if [[ $kind == snap ]]; then
      keep=(--checkpoint-dir "$work/ck" --checkpoint-interval 0 --snapshot-dir "$snaps" --snapshot-every-steps "$every")
    else
      keep=(--checkpoint-dir "$work/ck" --checkpoint-interval 0 --snapshot-every-steps 0 --checkpoint-every-steps "$every")
    fi
    read -r step snap ck < <(run "$model-$kind$every" "${margs[@]}" -- "${keep[@]}")
    stall=$([[ $kind == snap ]] && echo "$snap" || echo "$ck")
    per=$(calc "$stall / $steps * 1000" 3)
    printf '%-10s %-34s %12.2f %11s ms %9s%%\n' "$model" "$label" "$(calc "$step * 1000" 2)" "$per" \
      "$(calc "100 * $stall / $steps / $step" 2)"
  done
done

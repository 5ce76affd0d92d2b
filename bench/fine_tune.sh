#!/usr/bin/env bash
# A trained model as the start of a new run (--init-from), on the real default job: the main job
# (cnn on Fashion-MNIST, 4 epochs, N ranks) trains to a checkpoint; a new run starts from its
# weights and trains one more epoch at a small learning rate. It prints the trained run's test
# loss and accuracy, the new run's evaluation before its first step (the same bits, or not) and
# its accuracy after the epoch, and ends with key=value lines; exit 1 when the bits differ or the
# fine-tuned accuracy is below the target.
#
#   bench/fine_tune.sh [--ranks N] [--lr LR] [--target ACC]   # defaults: 2 ranks, lr 0.01, 0.92
#
# Minutes on a CPU (the default job); the run's figures depend on the machine (its CPU is named).
# HPCTRAIN: the binary (default build/src/hpctrain); FASHION_MNIST: the data (default Debian's).
set -euo pipefail
. "$(dirname "$0")/lib.sh"

ranks=2 lr=0.01 target=0.92
while [[ $# -gt 0 ]]; do
  case "$1" in
    --ranks) require_count --ranks "${2:-}"; ranks=$2; shift 2 ;;
    --lr) [[ "${2:-}" =~ ^[0-9]*\.?[0-9]+([eE]-?[0-9]+)?$ ]] || die "--lr must be a positive number, got '${2:-}'"
          lr=$2; shift 2 ;;
    --target) [[ "${2:-}" =~ ^0?\.[0-9]+$ ]] || die "--target must be an accuracy between 0 and 1, got '${2:-}'"
              target=$2; shift 2 ;;
    -h | --help) sed -n '2,12s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) die "unknown option '$1' (try --help)" ;;
  esac
done
REPO=$(cd "$(dirname "$0")/.." && pwd)
HPCTRAIN=${HPCTRAIN:-$REPO/build/src/hpctrain}
[[ -x "$HPCTRAIN" ]] || die "no hpctrain at $HPCTRAIN (build it, or set HPCTRAIN)"
data=(--data-dir "${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d /tmp/fine-tune-XXXXXX)
trap 'rm -rf "$work"' EXIT

echo "cpu: $(cpu_model)"
run() { mpirun --oversubscribe -np "$ranks" "$HPCTRAIN" "${data[@]}" --quiet "$@"; }
echo "the default job on $ranks rank(s)..."
run --checkpoint-dir "$work/base" --metrics-file "$work/base.jsonl"
echo "one more epoch from its weights at lr $lr..."
run --init-from "$work/base" --epochs 1 --lr "$lr" --checkpoint-dir "$work/tuned" --metrics-file "$work/tuned.jsonl"

base_loss=$(grep '"event":"done"' "$work/base.jsonl" | json_number test_loss)
base_acc=$(grep '"event":"done"' "$work/base.jsonl" | json_number test_accuracy)
init_loss=$(grep '"event":"init_from"' "$work/tuned.jsonl" | json_number test_loss)
tuned_acc=$(grep '"event":"done"' "$work/tuned.jsonl" | json_number test_accuracy)
same=no
[[ -n "$base_loss" && "$init_loss" == "$base_loss" ]] && same=yes
reached=no
awk "BEGIN { exit !($tuned_acc >= $target) }" && reached=yes
echo "trained: test loss $base_loss, accuracy $base_acc"
echo "--init-from, before its first step: test loss $init_loss (the same bits: $same)"
echo "after 1 epoch at lr $lr: accuracy $tuned_acc (target $target: $reached)"
echo "base_test_loss=$base_loss"
echo "base_test_accuracy=$base_acc"
echo "init_test_loss=$init_loss"
echo "same_bits=$same"
echo "fine_tuned_test_accuracy=$tuned_acc"
echo "target_reached=$reached"
[[ $same == yes && $reached == yes ]]

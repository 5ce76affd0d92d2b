#!/usr/bin/env bash
# Data-parallel hpctrain against PyTorch DDP on this machine, in one invocation:
#   1. mpirun -np R hpctrain (the default job's recipe, one thread per rank) for E epochs,
#      evaluating after each, with the gradient all-reduce overlapping the backward pass;
#   2. the same with --no-overlap, for --overlap-steps steps: what overlap hides;
#   3. shared/bench/torch_peer.py --ranks R --threads 1 --epochs E (PyTorch DDP over gloo).
# Prints both throughputs and their ratio (target: hpctrain / peer >= 2.0 at equal or
# better accuracy), both times to the target accuracy, and hpctrain's exposed communication
# (time the optimizer waits for buckets) per step, with overlap on and off.
#
# Usage: bench/mpi_vs_peer.sh [--ranks R] [--epochs E] [--target-accuracy A] [--overlap-steps N]
#        defaults: 2 ranks, 3 epochs (the default job), 0.92, 300 steps.
# Time to the target: hpctrain's training seconds up to the first epoch whose test accuracy
# reaches it; the peer evaluates only at its end, so its time is its whole training time if
# its final accuracy reaches the target, else "not reached".
# Environment: BUILD_DIR, HPCTRAIN, PEER, PYTHON (as bench/cpu_vs_peer.sh), MPIRUN
#              (default mpirun), MPIRUN_ARGS (extra mpirun options).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ranks=2 epochs=3 target=0.92 overlap_steps=300
while (($#)); do
  case "$1" in
    --ranks) ranks=${2:-}; shift 2 || die "--ranks needs a value" ;;
    --epochs) epochs=${2:-}; shift 2 || die "--epochs needs a value" ;;
    --target-accuracy) target=${2:-}; shift 2 || die "--target-accuracy needs a value" ;;
    --overlap-steps) overlap_steps=${2:-}; shift 2 || die "--overlap-steps needs a value" ;;
    -h | --help) sed -n '2,19s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) die "unknown option '$1' (try --help)" ;;
  esac
done
require_count --ranks "$ranks"
require_count --epochs "$epochs"
require_count --overlap-steps "$overlap_steps"
[[ "$target" =~ ^0?\.[0-9]+$ ]] || die "--target-accuracy must be a fraction like 0.92, got '$target'"
locate_programs
mpirun=${MPIRUN:-mpirun}
command -v "$mpirun" > /dev/null || die "no $mpirun (apt-get install openmpi-bin, or set MPIRUN)"
mpirun_args=(${MPIRUN_ARGS:-})
[[ $(id -u) -ne 0 ]] || mpirun_args+=(--allow-run-as-root)
((ranks <= $(nproc))) || mpirun_args+=(--oversubscribe)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "mpi_vs_peer: $(nproc) core(s), $ranks rank(s) x 1 thread, $epochs epoch(s), target accuracy $target"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"

echo
echo "== 1/3 hpctrain: $mpirun -np $ranks $hpctrain --threads 1 --epochs $epochs"
"$mpirun" "${mpirun_args[@]}" -np "$ranks" "$hpctrain" --threads 1 --epochs "$epochs" \
  --metrics-file "$tmp/on.jsonl" 2>&1 | sed -u 's/^/  /'
done_line=$(grep '"event":"done"' "$tmp/on.jsonl" | tail -n 1)
[[ -n "$done_line" ]] || die "hpctrain wrote no done line"
ours_ips=$(json_number images_per_second <<< "$done_line")
ours_acc=$(json_number test_accuracy <<< "$done_line")
wait_on=$(json_number comm_wait_seconds_per_step <<< "$done_line")
step_on=$(json_number step_seconds <<< "$done_line")
ours_t92="not reached"
while read -r line; do
  acc=$(json_number test_accuracy <<< "$line")
  if awk "BEGIN { exit !($acc >= $target) }"; then
    ours_t92="$(calc "$(json_number train_seconds <<< "$line")" 1) s"
    break
  fi
done < <(grep '"event":"epoch"' "$tmp/on.jsonl")

echo
echo "== 2/3 hpctrain without overlap: ... --no-overlap --max-steps $overlap_steps"
"$mpirun" "${mpirun_args[@]}" -np "$ranks" "$hpctrain" --threads 1 --epochs "$epochs" --max-steps "$overlap_steps" \
  --no-overlap --quiet --metrics-file "$tmp/off.jsonl"
off_line=$(grep '"event":"done"' "$tmp/off.jsonl" | tail -n 1)
[[ -n "$off_line" ]] || die "hpctrain --no-overlap wrote no done line"
wait_off=$(json_number comm_wait_seconds_per_step <<< "$off_line")
step_off=$(json_number step_seconds <<< "$off_line")
echo "  exposed communication $(calc "$wait_off * 1000" 3) ms per step of $(calc "$step_off * 1000" 2) ms"

echo
echo "== 3/3 peer: $python $peer --ranks $ranks --threads 1 --epochs $epochs"
"$python" "$peer" --ranks "$ranks" --threads 1 --epochs "$epochs" 2>&1 | tee "$tmp/peer.log" | sed -u 's/^/  /'
peer_line=$(grep '"images_per_s"' "$tmp/peer.log" | tail -n 1)
[[ -n "$peer_line" ]] || die "the peer printed no result line"
peer_ips=$(json_number images_per_s <<< "$peer_line")
peer_acc=$(json_number test_acc <<< "$peer_line")
peer_train=$(json_number train_s <<< "$peer_line")
peer_t92="not reached"
awk "BEGIN { exit !($peer_acc >= $target) }" && peer_t92="$(calc "$peer_train" 1) s (its whole run)"

ratio=$(calc "$ours_ips / $peer_ips" 2)
met=$(awk "BEGIN { print ($ours_ips / $peer_ips >= 2.0 && $ours_acc >= $peer_acc) ? \"yes\" : \"no\" }")
share_on=$(calc "100 * $wait_on / $step_on" 2)
share_off=$(calc "100 * $wait_off / $step_off" 2)
echo
echo "hpctrain: $(calc "$ours_ips" 1) images/s, final test accuracy $ours_acc, time to $target: $ours_t92"
echo "peer:     $(calc "$peer_ips" 1) images/s, final test accuracy $peer_acc, time to $target: $peer_t92"
echo "ratio hpctrain/peer: $ratio (target >= 2.0 at equal or better accuracy: $met)"
echo "exposed communication per step: $(calc "$wait_on * 1000" 3) ms = $share_on% of the step with overlap" \
  "(target < 5%), $(calc "$wait_off * 1000" 3) ms = $share_off% without"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg) (another job on the machine makes all of this noisy)"
echo
echo "== summary"
cat << SUMMARY
ranks=$ranks
epochs=$epochs
hpctrain_images_per_second=$(calc "$ours_ips" 1)
hpctrain_test_accuracy=$ours_acc
hpctrain_time_to_target=$ours_t92
peer_images_per_second=$(calc "$peer_ips" 1)
peer_test_accuracy=$peer_acc
peer_time_to_target=$peer_t92
ratio_hpctrain_over_peer=$ratio
ratio_target_met=$met
exposed_comm_ms_per_step_overlap=$(calc "$wait_on * 1000" 3)
exposed_comm_percent_overlap=$share_on
exposed_comm_ms_per_step_no_overlap=$(calc "$wait_off * 1000" 3)
exposed_comm_percent_no_overlap=$share_off
SUMMARY

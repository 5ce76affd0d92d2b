#!/usr/bin/env bash
# Data-parallel hpctrain against PyTorch DDP on this machine, in one invocation:
#   1. mpirun -np R hpctrain (the default job's recipe, one thread per rank) for E epochs,
#      evaluating after each, with the gradient all-reduce overlapping the backward pass;
#   2. the same with --no-overlap, for --overlap-steps steps: what overlap hides;
#   3. shared/bench/torch_peer.py --ranks R --threads 1 --epochs E (PyTorch DDP over gloo);
#   4. bench/gemm_shapes --peak-only --threads R: this machine's sgemm rate on R threads.
# First it prints the CPU, its ISA (avx512f, avx2 or other) and the oneDNN convolution
# kernels hpctrain runs on it (one step with ONEDNN_VERBOSE=1). Prints both throughputs and
# their ratio (target: hpctrain / peer >= 2.0 at equal or better accuracy), both times to the
# target accuracy, and hpctrain's exposed communication (time the optimizer waits for
# buckets) per step, with overlap on and off, and hpctrain's training GFLOP/s as a fraction
# of the sgemm rate of step 4 (target: at least 60%). With --seeds N, steps 1 and 3 run N times each
# with seeds 1..N: each run's test accuracy, the mean and sample standard deviation of both
# sides are printed, and the ratio and the verdict come from the means.
#
# Usage: bench/mpi_vs_peer.sh [--ranks R] [--epochs E] [--target-accuracy A] [--overlap-steps N]
#                             [--seeds N] [--label-smoothing S]
#        defaults: 2 ranks, 4 epochs and label smoothing 0.1 (the default job's), 0.92, 300
#        steps, 1 seed (no --seed given: both sides' default, 1). S is passed to both sides as
#        --label-smoothing, 0 included.
# Time to the target: hpctrain's training seconds up to the first epoch whose test accuracy
# reaches it; the peer evaluates only at its end, so its time is its whole training time if
# its final accuracy reaches the target, else "not reached".
# Environment: BUILD_DIR, HPCTRAIN, PEER, PYTHON, GEMM_SHAPES (as bench/cpu_vs_peer.sh), MPIRUN
#              (default mpirun), MPIRUN_ARGS (extra mpirun options).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ranks=2 epochs=4 target=0.92 overlap_steps=300 seeds=1 smoothing=$default_smoothing
while (($#)); do
  case "$1" in
    --ranks) ranks=${2:-}; shift 2 || die "--ranks needs a value" ;;
    --epochs) epochs=${2:-}; shift 2 || die "--epochs needs a value" ;;
    --target-accuracy) target=${2:-}; shift 2 || die "--target-accuracy needs a value" ;;
    --overlap-steps) overlap_steps=${2:-}; shift 2 || die "--overlap-steps needs a value" ;;
    --seeds) seeds=${2:-}; shift 2 || die "--seeds needs a value" ;;
    --label-smoothing) smoothing=${2:-}; shift 2 || die "--label-smoothing needs a value" ;;
    -h | --help) sed -n '2,28s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) die "unknown option '$1' (try --help)" ;;
  esac
done
require_count --ranks "$ranks"
require_count --epochs "$epochs"
require_count --overlap-steps "$overlap_steps"
require_count --seeds "$seeds"
require_smoothing "$smoothing"
smoothing_flag "$smoothing"
[[ "$target" =~ ^0?\.[0-9]+$ ]] || die "--target-accuracy must be a fraction like 0.92, got '$target'"
locate_programs
[[ -x "$gemm_shapes" ]] || die "no gemm_shapes binary at $gemm_shapes (run ./setup.sh, or set GEMM_SHAPES)"
mpirun=${MPIRUN:-mpirun}
command -v "$mpirun" > /dev/null || die "no $mpirun (apt-get install openmpi-bin, or set MPIRUN)"
mpirun_args=(${MPIRUN_ARGS:-})
[[ $(id -u) -ne 0 ]] || mpirun_args+=(--allow-run-as-root)
((ranks <= $(nproc))) || mpirun_args+=(--oversubscribe)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

peer_bench_header mpi_vs_peer \
  "$(nproc) core(s), $ranks rank(s) x 1 thread, $epochs epoch(s), target accuracy $target" 1

# time_to_target "TIMES" SUFFIX: the time to the target over the runs ("" for a run that
# did not reach it): as it always read for one run; for several, the mean of those that did.
time_to_target() {
  local -a reached
  read -r -a reached <<< "$1"
  if ((seeds == 1)); then
    ((${#reached[@]})) && echo "$(calc "${reached[0]}" 1) s$2" || echo "not reached"
  elif ((${#reached[@]})); then
    echo "mean $(calc "$(mean "${reached[@]}")" 1) s over the ${#reached[@]} of $seeds seeds that reached it$2"
  else
    echo "not reached (0 of $seeds seeds)"
  fi
}

ours_ips_runs=() ours_acc_runs=() wait_on_runs=() step_on_runs=() ours_reached=""
for ((s = 1; s <= seeds; s++)); do
  seed_args "$s"
  ours_run "$s" 1/4 "$mpirun" "${mpirun_args[@]}" -np "$ranks" "$hpctrain" --threads 1 --epochs "$epochs" "${seed[@]}" \
    "${smoothing_args[@]}"
  wait_on_runs+=("$(json_number comm_wait_seconds_per_step <<< "$done_line")")
  step_on_runs+=("$(json_number step_seconds <<< "$done_line")")
  while read -r line; do
    acc=$(json_number test_accuracy <<< "$line")
    if awk "BEGIN { exit !($acc >= $target) }"; then
      ours_reached+=" $(json_number train_seconds <<< "$line")"
      break
    fi
  done < <(grep '"event":"epoch"' "$tmp/ours.jsonl")
done
train_flops "$done_line" "$tmp/hpctrain.log"
wait_on=$(mean "${wait_on_runs[@]}") step_on=$(mean "${step_on_runs[@]}")
ours_t92=$(time_to_target "$ours_reached" "")

echo
echo "== 2/4 hpctrain without overlap: ... --no-overlap --max-steps $overlap_steps"
"$mpirun" "${mpirun_args[@]}" -np "$ranks" "$hpctrain" --threads 1 --epochs "$epochs" --max-steps "$overlap_steps" \
  "${smoothing_args[@]}" --no-overlap --quiet --metrics-file "$tmp/off.jsonl"
off_line=$(grep '"event":"done"' "$tmp/off.jsonl" | tail -n 1)
[[ -n "$off_line" ]] || die "hpctrain --no-overlap wrote no done line"
wait_off=$(json_number comm_wait_seconds_per_step <<< "$off_line")
step_off=$(json_number step_seconds <<< "$off_line")
echo "  exposed communication $(calc "$wait_off * 1000" 3) ms per step of $(calc "$step_off * 1000" 2) ms"

peer_ips_runs=() peer_acc_runs=() peer_reached=""
for ((s = 1; s <= seeds; s++)); do
  peer_run "$s" 3/4 "$ranks"
  if awk "BEGIN { exit !(${peer_acc_runs[-1]} >= $target) }"; then
    peer_reached+=" $(json_number train_s <<< "$peer_line")"
  fi
done
peer_bench_means
peer_t92=$(time_to_target "$peer_reached" " (its whole run)")

echo
echo "== 4/4 sgemm rate: $gemm_shapes --peak-only --threads $ranks"
sgemm_peak "$ranks"
peer_bench_rates
fraction_met=$(awk "BEGIN { print ($fraction >= 0.6) ? \"yes\" : \"no\" }")

met=$(awk "BEGIN { print ($ours_ips / $peer_ips >= 2.0 && $ours_acc >= $peer_acc) ? \"yes\" : \"no\" }")
share_on=$(calc "100 * $wait_on / $step_on" 2)
share_off=$(calc "100 * $wait_off / $step_off" 2)
peer_bench_results "final test accuracy" "mean of N seeds" ", time to $target: $ours_t92" ", time to $target: $peer_t92"
echo "ratio hpctrain/peer: $ratio (target >= 2.0 at equal or better accuracy: $met)"
echo "exposed communication per step: $(calc "$wait_on * 1000" 3) ms = $share_on% of the step with overlap" \
  "(target < 5%), $(calc "$wait_off * 1000" 3) ms = $share_off% without"
echo "hpctrain achieved: $gflops GFLOP/s of $peak measured sgemm GFLOP/s with $ranks threads" \
  "($(calc "$fraction * 100" 1)%; target >= 60%: $fraction_met)"
peer_bench_tail
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
$(peer_bench_summary)
train_flops_per_image=$flops
hpctrain_gflops=$gflops
peak_sgemm_gflops=$peak
fraction_of_peak=$fraction
fraction_target=0.6
fraction_target_met=$fraction_met
SUMMARY

#!/usr/bin/env bash
# hpctrain against its PyTorch peer on the CPU, in one invocation on one machine (machines
# here are shared and noisy, so only figures taken side by side compare):
#   1. hpctrain, the default job's recipe (cnn, Fashion-MNIST, batch 64, SGD Nesterov,
#      one-cycle), one process, one thread;
#   2. shared/bench/torch_peer.py, the same work in PyTorch: one rank, one thread;
#   3. bench/gemm_shapes --peak-only: this machine's single-thread sgemm peak.
# First it prints the CPU, its ISA (avx512f, avx2 or other) and the oneDNN convolution
# kernels hpctrain runs on it (one step with ONEDNN_VERBOSE=1). Prints both throughputs,
# their ratio (target: hpctrain / peer >= 2.0), and hpctrain's achieved GFLOP/s as a
# fraction of that peak. With --seeds N, steps 1 and 2 run N times each with seeds 1..N;
# each run's test accuracy, their mean and sample standard deviation are printed, and the
# ratio and GFLOP/s come from the mean throughputs.
#
# Usage: bench/cpu_vs_peer.sh [--epochs E] [--seeds N] [--label-smoothing S]
#        defaults: 1 epoch (the peer needs about a minute per epoch on one thread, hpctrain
#        less), 1 seed (no --seed given: both sides' default, 1), label smoothing 0.1 (the
#        default job's; S is passed to both sides as --label-smoothing, 0 included).
# Environment: BUILD_DIR (default build), HPCTRAIN and GEMM_SHAPES (binaries), PEER (the
#              peer script, default ../shared/bench/torch_peer.py from the repository root),
#              PYTHON (default /usr/bin/python3, where Debian's python3-torch lives).
# Needs ./setup.sh --bench (python3-torch) and the dataset-fashion-mnist package.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

epochs=1 seeds=1 smoothing=$default_smoothing
while (($#)); do
  case "$1" in
    --epochs) [[ $# -ge 2 ]] || die "--epochs needs a value"; epochs=$2; shift 2 ;;
    --epochs=*) epochs=${1#--epochs=}; shift ;;
    --seeds) [[ $# -ge 2 ]] || die "--seeds needs a value"; seeds=$2; shift 2 ;;
    --seeds=*) seeds=${1#--seeds=}; shift ;;
    --label-smoothing) [[ $# -ge 2 ]] || die "--label-smoothing needs a value"; smoothing=$2; shift 2 ;;
    --label-smoothing=*) smoothing=${1#--label-smoothing=}; shift ;;
    -h | --help) sed -n '2,23s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) die "unknown option '$1' (try --help)" ;;
  esac
done
require_count --epochs "$epochs"
require_count --seeds "$seeds"
require_smoothing "$smoothing"
smoothing_flag "$smoothing"
locate_programs
threads=1
[[ -x "$gemm_shapes" ]] || die "no gemm_shapes binary at $gemm_shapes (run ./setup.sh, or set GEMM_SHAPES)"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

peer_bench_header cpu_vs_peer "$(nproc) core(s), $(cpu_model); $epochs epoch(s), $threads thread(s), 1 process each" \
  "$threads"

ours_ips_runs=() ours_acc_runs=()
for ((s = 1; s <= seeds; s++)); do
  seed_args "$s"
  ours_run "$s" 1/3 "$hpctrain" --threads "$threads" --epochs "$epochs" "${seed[@]}" "${smoothing_args[@]}"
done
peer_ips_runs=() peer_acc_runs=()
for ((s = 1; s <= seeds; s++)); do peer_run "$s" 2/3 1; done
peer_bench_means

echo
echo "== 3/3 sgemm peak: $gemm_shapes --peak-only --threads $threads"
sgemm_peak "$threads"

train_flops "$done_line" "$tmp/hpctrain.log"

peer_bench_rates
met=$(awk "BEGIN { print ($ours_ips / $peer_ips >= 2.0) ? \"yes\" : \"no\" }")

peer_bench_results "test accuracy" "means of N seeds"
echo "ratio hpctrain/peer: $ratio (target >= 2.0: $met)"
echo "hpctrain achieved: $gflops GFLOP/s of $peak peak sgemm GFLOP/s ($(calc "$fraction * 100" 1)%)"
peer_bench_tail
cat << EOF
epochs=$epochs
threads=$threads
hpctrain_images_per_second=$(calc "$ours_ips" 1)
hpctrain_test_accuracy=$ours_acc
peer_images_per_second=$(calc "$peer_ips" 1)
peer_test_accuracy=$peer_acc
ratio_hpctrain_over_peer=$ratio
ratio_target=2.0
ratio_target_met=$met
train_flops_per_image=$flops
hpctrain_gflops=$gflops
peak_sgemm_gflops=$peak
fraction_of_peak=$fraction
EOF
peer_bench_summary

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

cpu=$(cpu_model) isa=$(cpu_isa)
runs="1 process each"
((seeds == 1)) || runs+=", seeds 1..$seeds"
runs+=", label smoothing $smoothing"
echo "cpu_vs_peer: $(nproc) core(s), $cpu; $epochs epoch(s), $threads thread(s), $runs"
echo "cpu: $cpu, ISA $isa"
print_conv_kernels "$threads"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"

# seed_args S: the --seed flag for run S, none when there is one run (each side's default).
seed_args() { seed=(); ((seeds == 1)) || seed=(--seed "$1"); }
# run_label S: ", seed S of N" in the step headers when there are several runs.
run_label() { ((seeds == 1)) || echo ", seed $1 of $seeds"; }

ours_ips_runs=() ours_acc_runs=()
for ((s = 1; s <= seeds; s++)); do
  seed_args "$s"
  echo
  cmd=("$hpctrain" --threads "$threads" --epochs "$epochs" "${seed[@]}" "${smoothing_args[@]}")
  echo "== 1/3 hpctrain$(run_label "$s"): ${cmd[*]}"
  "${cmd[@]}" --metrics-file "$tmp/metrics.jsonl" 2>&1 | tee "$tmp/hpctrain.log" | sed -u 's/^/  /'
  done_line=$(grep '"event":"done"' "$tmp/metrics.jsonl" | tail -n 1)
  [[ -n "$done_line" ]] || die "hpctrain wrote no done line to its metrics file"
  ours_ips_runs+=("$(json_number images_per_second <<< "$done_line")")
  ours_acc_runs+=("$(json_number test_accuracy <<< "$done_line")")
  rm -f "$tmp/metrics.jsonl"
done

peer_ips_runs=() peer_acc_runs=()
for ((s = 1; s <= seeds; s++)); do
  seed_args "$s"
  echo
  cmd=("$python" "$peer" --ranks 1 --threads "$threads" --epochs "$epochs" "${seed[@]}" "${smoothing_args[@]}")
  echo "== 2/3 peer$(run_label "$s"): ${cmd[*]}"
  "${cmd[@]}" 2>&1 | tee "$tmp/peer.log" | sed -u 's/^/  /'
  peer_line=$(grep '"images_per_s"' "$tmp/peer.log" | tail -n 1)
  [[ -n "$peer_line" ]] || die "the peer printed no result line"
  peer_ips_runs+=("$(json_number images_per_s <<< "$peer_line")")
  peer_acc_runs+=("$(json_number test_acc <<< "$peer_line")")
done
ours_ips=$(mean "${ours_ips_runs[@]}") ours_acc=$(mean "${ours_acc_runs[@]}") ours_sd=$(sample_sd "${ours_acc_runs[@]}")
peer_ips=$(mean "${peer_ips_runs[@]}") peer_acc=$(mean "${peer_acc_runs[@]}") peer_sd=$(sample_sd "${peer_acc_runs[@]}")

echo
echo "== 3/3 sgemm peak: $gemm_shapes --peak-only --threads $threads"
sgemm_peak "$threads"

train_flops "$done_line" "$tmp/hpctrain.log"

ratio=$(calc "$ours_ips / $peer_ips" 2)
gflops=$(calc "$ours_ips * $flops / 1e9" 1)
fraction=$(calc "$ours_ips * $flops / 1e9 / $peak" 3)
met=$(awk "BEGIN { print ($ours_ips / $peer_ips >= 2.0) ? \"yes\" : \"no\" }")

echo
per_seed_report "$seeds" "test accuracy" "means of N seeds"
echo "hpctrain: $(calc "$ours_ips" 1) images/s, test accuracy $ours_acc${of:-}"
echo "peer:     $(calc "$peer_ips" 1) images/s, test accuracy $peer_acc${of:-}"
echo "ratio hpctrain/peer: $ratio (target >= 2.0: $met)"
echo "hpctrain achieved: $gflops GFLOP/s of $peak peak sgemm GFLOP/s ($(calc "$fraction * 100" 1)%)"
echo "training FLOPs per image: $flops ($flops_source)"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg) (another job on the machine makes all of this noisy)"
echo
echo "== summary"
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
seeds=$seeds
label_smoothing=$smoothing
hpctrain_test_accuracy_sd=$ours_sd
peer_test_accuracy_sd=$peer_sd
hpctrain_test_accuracies=$(IFS=,; echo "${ours_acc_runs[*]}")
peer_test_accuracies=$(IFS=,; echo "${peer_acc_runs[*]}")
cpu_model=$cpu
cpu_isa=$isa
onednn_isa=$onednn_isa
onednn_conv_kernels=$conv_kernels
EOF

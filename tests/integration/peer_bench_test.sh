#!/usr/bin/env bash
# bench/cpu_vs_peer.sh and bench/mpi_vs_peer.sh with stand-ins for hpctrain, the PyTorch peer,
# python3, mpirun and gemm_shapes (the real runs take minutes and need python3-torch): the
# CPU/ISA and oneDNN kernel lines, --seeds N (seeds 1..N to both sides, mean and sample
# standard deviation, the verdict on the means), --label-smoothing passed to both sides always
# (by default the default job's 0.1, which the peer would not use on its own; 0 as 0), and bad
# values refused with exit 2 (recipe_vs_peer.sh's too). And bench/gpu_vs_peer.sh, which only
# runs on a lent GPU machine, with stand-ins for nvidia-smi, ncu and the GPU build.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bench=$(cd "$here/../../bench" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
checks=0 failures=0

# fail MESSAGE OUTPUT: one failed check, with the script's output.
fail() {
  local line
  echo "FAILED: $1"
  while IFS= read -r line; do echo "  | $line"; done <<< "$2"
  failures=$((failures + 1))
}

# expect OUTPUT TEXT...: every TEXT is a line of OUTPUT.
expect() {
  local out=$1 text
  shift
  for text in "$@"; do
    checks=$((checks + 1))
    grep -qxF -- "$text" <<< "$out" || fail "no line '$text'" "$out"
  done
}

# refuse SCRIPT TEXT ARGS...: SCRIPT ARGS exits 2 with the one line TEXT on stderr.
refuse() {
  local script=$1 text=$2 out code
  shift 2
  out=$("$bench/$script" "$@" 2>&1 > /dev/null)
  code=$?
  checks=$((checks + 1))
  [[ $code == 2 && "$out" == "$script: error: $text" ]] || fail "$script $* exited $code, wanted 2 and '$text'" "$out"
}

# The stand-ins log their arguments to $tmp/calls. Accuracies by seed are chosen so that
# seed 1 alone loses to the peer (0.9187 < 0.9215, as in issue 26) while the means over
# three seeds win (0.92190 > 0.92083).
cat > "$tmp/hpctrain" << 'EOF'
#!/usr/bin/env bash
if [[ -n "${ONEDNN_VERBOSE:-}" ]]; then
  echo "onednn_verbose,info,cpu,isa:Intel AVX2"
  echo "onednn_verbose,exec,cpu,convolution,jit:avx2,forward_training,src_f32::blocked:acdb:f0,,alg:convolution_direct,mb64_ic1oc32_ih28oh28kh3sh1dh0ph1_iw28ow28kw3sw1dw0pw1,1.0"
  echo "onednn_verbose,exec,cpu,convolution,gemm:jit,backward_weights,src_f32::blocked:acdb:f0,,alg:convolution_direct,mb64_ic32oc64_ih14oh14kh3sh1dh0ph1_iw14ow14kw3sw1dw0pw1,1.0"
  echo "onednn_verbose,exec,cpu,convolution,jit:avx2,forward_training,src_f32::blocked:acdb:f0,,alg:convolution_direct,mb1000_ic1oc32_ih28oh28kh3sh1dh0ph1_iw28ow28kw3sw1dw0pw1,1.0"
  exit 0
fi
echo "hpctrain $*" >> "$STUB_CALLS"
seed=1 metrics=/dev/null
while (($#)); do
  case "$1" in
    --seed) seed=$2; shift ;;
    --metrics-file) metrics=$2; shift ;;
  esac
  shift
done
acc=(0 0.9187 0.9240 0.9230)
cat >> "$metrics" << JSON
{"event":"epoch","epoch":1,"test_accuracy":0.9,"train_seconds":10}
{"event":"epoch","epoch":2,"test_accuracy":${acc[seed]},"train_seconds":2$seed}
{"event":"done","images_per_second":$((3000 + 100 * seed)),"test_accuracy":${acc[seed]},"comm_wait_seconds_per_step":0.001,"step_seconds":0.02,"train_flops_per_sample":25000000}
JSON
EOF
cat > "$tmp/peer.py" << 'EOF'
echo "peer $*" >> "$STUB_CALLS"
seed=1
while (($#)); do [[ $1 != --seed ]] || seed=$2; shift; done
acc=(0 0.9215 0.9200 0.9210)
echo "{\"peer\": \"stand-in\", \"train_s\": 3$seed.0, \"images_per_s\": $((1000 + 100 * seed)).0, \"test_acc\": ${acc[seed]}}"
EOF
# python3 that has torch (require_torch asks it with -c) and runs the peer stand-in.
cat > "$tmp/python" << 'EOF'
#!/usr/bin/env bash
[[ $1 == -c ]] && exit 0
exec bash "$@"
EOF
# mpirun runs the command once, as rank 0 would write the metrics.
cat > "$tmp/mpirun" << 'EOF'
#!/usr/bin/env bash
while [[ $1 != -np ]]; do shift; done
shift 2
exec "$@"
EOF
# gemm_shapes --peak-only --threads T: 120 GFLOP/s per thread.
cat > "$tmp/gemm_shapes" << 'EOF'
#!/usr/bin/env bash
echo "gemm_shapes $*" >> "$STUB_CALLS"
echo "peak_sgemm_gflops=$((120 * $3)).0"
EOF
chmod +x "$tmp/hpctrain" "$tmp/python" "$tmp/mpirun" "$tmp/gemm_shapes"
export HPCTRAIN=$tmp/hpctrain PEER=$tmp/peer.py PYTHON=$tmp/python MPIRUN=$tmp/mpirun GEMM_SHAPES=$tmp/gemm_shapes
export STUB_CALLS=$tmp/calls

isa=$(grep -o -w -m1 'avx512f' /proc/cpuinfo || grep -o -w -m1 'avx2' /proc/cpuinfo || echo other)
kernel_lines=(
  "oneDNN convolution kernels (one training step, ONEDNN_VERBOSE=1; oneDNN ISA: Intel AVX2):"
  "  ic1oc32 28x28 k3: forward_training jit:avx2"
  "  ic32oc64 14x14 k3: backward_weights gemm:jit"
  "cpu_isa=$isa"
  "onednn_conv_kernels=jit:avx2 gemm:jit")

# The default: one run each, no --seed, the default job's label smoothing on both sides, seed
# 1's figures as they are.
: > "$STUB_CALLS"
out=$("$bench/cpu_vs_peer.sh" 2>&1) || fail "cpu_vs_peer.sh failed" "$out"
expect "$out" "${kernel_lines[@]}" "hpctrain_test_accuracy=0.9187" "peer_test_accuracy=0.9215" \
  "hpctrain_test_accuracy_sd=n/a" "seeds=1" "label_smoothing=0.1" "ratio_hpctrain_over_peer=2.82"
calls=$(cat "$STUB_CALLS")
expect "$calls" "peer --ranks 1 --threads 1 --epochs 1 --label-smoothing 0.1"
checks=$((checks + 1))
grep -qx -- "hpctrain --threads 1 --epochs 1 --label-smoothing 0.1 --metrics-file [^ ]*" <<< "$calls" ||
  fail "hpctrain got other options" "$calls"

# Three seeds with label smoothing: both sides get each seed and the smoothing.
: > "$STUB_CALLS"
out=$("$bench/mpi_vs_peer.sh" --seeds 3 --label-smoothing 0.1 --overlap-steps 5 2>&1) ||
  fail "mpi_vs_peer.sh --seeds 3 failed" "$out"
expect "$out" "${kernel_lines[@]}" \
  "  seed 1: hpctrain 0.9187, 3100.0; peer 0.9215, 1100.0" \
  "hpctrain final test accuracy over 3 seeds: mean 0.92190, sample sd 0.00282" \
  "peer final test accuracy over 3 seeds:     mean 0.92083, sample sd 0.00076" \
  "ratio hpctrain/peer: 2.67 (target >= 2.0 at equal or better accuracy: yes)" \
  "hpctrain_time_to_target=mean 22.5 s over the 2 of 3 seeds that reached it" \
  "peer_time_to_target=mean 32.0 s over the 3 of 3 seeds that reached it (its whole run)" \
  "hpctrain_test_accuracies=0.9187,0.9240,0.9230" "peer_test_accuracies=0.9215,0.9200,0.9210" \
  "label_smoothing=0.1" "seeds=3"
calls=$(grep -v max-steps "$STUB_CALLS")
for s in 1 2 3; do
  checks=$((checks + 2))
  grep -q -- "^hpctrain .*--seed $s --label-smoothing 0.1 " <<< "$calls" || fail "hpctrain got no seed $s with smoothing" "$calls"
  grep -q -- "^peer .*--seed $s --label-smoothing 0.1$" <<< "$calls" || fail "the peer got no seed $s with smoothing" "$calls"
done

# The training work against the sgemm rate on as many threads as ranks: the mean 3200 img/s
# x 25 MFLOP = 80 GFLOP/s, of 240 on 2 threads (short of 60%) and of 120 on 1 (past it).
expect "$out" "hpctrain achieved: 80.0 GFLOP/s of 240.0 measured sgemm GFLOP/s with 2 threads (33.3%; target >= 60%: no)" \
  "train_flops_per_image=25000000" "hpctrain_gflops=80.0" "peak_sgemm_gflops=240.0" "fraction_of_peak=0.333" \
  "fraction_target=0.6" "fraction_target_met=no"
expect "$(cat "$STUB_CALLS")" "gemm_shapes --peak-only --threads 2"
out=$("$bench/mpi_vs_peer.sh" --ranks 1 --seeds 3 --overlap-steps 5 2>&1) || fail "mpi_vs_peer.sh --ranks 1 failed" "$out"
expect "$out" "hpctrain achieved: 80.0 GFLOP/s of 120.0 measured sgemm GFLOP/s with 1 threads (66.7%; target >= 60%: yes)" \
  "fraction_of_peak=0.667" "fraction_target_met=yes"
GEMM_SHAPES=$tmp/none refuse mpi_vs_peer.sh "no gemm_shapes binary at $tmp/none (run ./setup.sh, or set GEMM_SHAPES)"
GEMM_SHAPES=/bin/true refuse mpi_vs_peer.sh "gemm_shapes printed no peak_sgemm_gflops line" --overlap-steps 5
printf '#!/bin/sh\necho "gemm_shapes: out of memory" >&2\nexit 1\n' > "$tmp/gemm_fails"
printf '#!/bin/sh\necho peak_sgemm_gflops=0.0\n' > "$tmp/gemm_zero"
chmod +x "$tmp/gemm_fails" "$tmp/gemm_zero"
GEMM_SHAPES=$tmp/gemm_fails refuse mpi_vs_peer.sh "$tmp/gemm_fails --peak-only --threads 2 failed: gemm_shapes: out of memory" --overlap-steps 5
GEMM_SHAPES=$tmp/gemm_zero refuse cpu_vs_peer.sh "gemm_shapes printed peak_sgemm_gflops=0.0, not a positive GFLOP/s figure"

# One seed decides against hpctrain where the means of three do not (the case above).
out=$("$bench/mpi_vs_peer.sh" --overlap-steps 5 2>&1) || fail "mpi_vs_peer.sh failed" "$out"
expect "$out" "ratio_target_met=no" "hpctrain_time_to_target=not reached" "peer_time_to_target=31.0 s (its whole run)"

# --label-smoothing 0 goes to both sides too: hpctrain's default would smooth.
: > "$STUB_CALLS"
out=$("$bench/cpu_vs_peer.sh" --seeds=2 --label-smoothing=0.0 2>&1) || fail "cpu_vs_peer.sh --seeds=2 failed" "$out"
expect "$out" "hpctrain test accuracy over 2 seeds: mean 0.92135, sample sd 0.00375" \
  "hpctrain: 3150.0 images/s, test accuracy 0.92135 (means of 2 seeds)" "label_smoothing=0.0"
for side in hpctrain peer; do
  checks=$((checks + 1))
  [[ $(grep -c -- "^$side .*--label-smoothing 0.0\( \|$\)" "$STUB_CALLS") == 2 ]] ||
    fail "$side did not get --label-smoothing 0.0 on both seeds" "$(cat "$STUB_CALLS")"
done

for script in cpu_vs_peer.sh mpi_vs_peer.sh; do
  refuse "$script" "--seeds must be a positive integer, got '0'" --seeds 0
  refuse "$script" "--seeds needs a value" --seeds
  refuse "$script" "--label-smoothing must be a number in [0, 1) such as 0.1, got '1'" --label-smoothing 1
  refuse "$script" "--label-smoothing must be a number in [0, 1) such as 0.1, got '-0.1'" --label-smoothing -0.1
done

# recipe_vs_peer.sh checks its options before it looks for hpctrain, torch and onnx.
refuse recipe_vs_peer.sh "--steps must be a positive integer, got '0'" --steps 0
refuse recipe_vs_peer.sh "--samples must be a positive integer, got 'x'" --samples x
refuse recipe_vs_peer.sh "--lr must be a positive number, got '-1'" --lr -1
refuse recipe_vs_peer.sh "--lr must be a positive number, got '0'" --lr 0
refuse recipe_vs_peer.sh "--steps must be a positive integer of at most 18 digits, got '18446744073709551617'" \
  --steps 18446744073709551617  # bash's arithmetic took it for 1
refuse cpu_vs_peer.sh "--epochs must be a positive integer of at most 18 digits, got '99999999999999999999'" \
  --epochs 99999999999999999999
refuse recipe_vs_peer.sh "--lr must be a positive number, got '1e999'" --lr 1e999  # awk's own line, "decimal overflow", not said
refuse recipe_vs_peer.sh "--label-smoothing must be a number in [0, 1) such as 0.1, got '1'" --label-smoothing 1
refuse recipe_vs_peer.sh "--loss-tolerance must be a number, got 'tiny'" --loss-tolerance tiny
refuse recipe_vs_peer.sh "unknown option '--seeds' (see --help)" --seeds 2
HPCTRAIN=$tmp/none refuse recipe_vs_peer.sh "no hpctrain binary at $tmp/none (run ./setup.sh, or set BUILD_DIR or HPCTRAIN)"

# bench/gpu_vs_peer.sh, which only ever runs on a lent GPU machine: its options, `all` out of
# time, and the kernels step's reading of ncu's per-launch durations and DRAM bytes against the
# copy bandwidth (bench/ncu_kernels.py, whose arithmetic ncu_kernels_test checks), with stand-ins
# for nvidia-smi, ncu, the GPU build and the cuDNN/NCCL packages.
gpu=$tmp/gpu
mkdir -p "$gpu/bin" "$gpu/build/src" "$gpu/build/bench" "$gpu/data" "$gpu/nv/include" "$gpu/nv/lib"
touch "$gpu/data/train-images-idx3-ubyte.gz" "$gpu/nv/include/"{cudnn.h,nccl.h} "$gpu/nv/lib/"{libcudnn.so.9,libnccl.so.2}
printf '#!/bin/sh\n[ "$1" = -L ] && echo "GPU 0: Stand-in" || echo Stand-in GPU\n' > "$gpu/bin/nvidia-smi"
cat > "$gpu/build/bench/gpu_step" << 'STUB'
#!/bin/sh
echo "gpu_step $*" >> "$STUB_CALLS"
case "$1" in
  --copy-bandwidth) echo '{"workload": "copy", "copy_bytes_per_s": 4000000000000}' ;;
  --kernel-shapes)  # two launch choices' totals, fastest first, as gpu_step sorts them
    echo '{"workload": "batch_norm", "tuning": "16,2,4,0", "rows": 6272, "channels": 2048, "forward_ms": 0.09}'
    echo '{"workload": "batch_norm_resnet50", "tuning": "16,2,4,0,256,1", "default": 0, "batch_norms_ms": 7.5, "relu_backward_ms": 2.2}'
    echo '{"workload": "batch_norm_resnet50", "tuning": "8,4,2,1,1024", "default": 1, "batch_norms_ms": 9.0, "relu_backward_ms": 2.2}' ;;
  *) echo '{"step_ms": 1}' ;;
esac
STUB
printf '#!/bin/sh\nexit 0\n' > "$gpu/build/src/hpctrain"
# python: nvidia.cudnn and nvidia.nccl are $gpu/nv; torch is there; scripts run for real.
cat > "$gpu/bin/python" << STUB
#!/usr/bin/env bash
[[ \$1 == -c && \$2 == *nvidia.* ]] && { echo "$gpu/nv"; exit 0; }
[[ \$1 == -c ]] && exit 0
exec /usr/bin/python3 "\$@"
STUB
# ncu: runs the program, then writes two steps of four launches as ncu's CSV names them (ours
# in an anonymous namespace, with templates and arguments), each with its duration and the DRAM
# bytes it read and wrote, or none with NCU_EMPTY set.
cat > "$gpu/bin/ncu" << 'STUB'
#!/usr/bin/env bash
log=
while [[ $1 != */gpu_step ]]; do
  [[ $1 == --log-file ]] && log=$2
  [[ $1 == --metrics ]] && echo "ncu --metrics $2" >> "$STUB_CALLS"
  shift
done
"$@" > /dev/null
echo '==PROF== Disconnected' > "$log"
[[ -n ${NCU_EMPTY:-} ]] && exit 0
echo '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"' >> "$log"
launch() {  # ID NAME NS READ WRITE
  echo "\"$1\",\"$2\",\"gpu__time_duration.sum\",\"nsecond\",\"$3\""
  echo "\"$1\",\"$2\",\"dram__bytes_read.sum\",\"byte\",\"$4\""
  echo "\"$1\",\"$2\",\"dram__bytes_write.sum\",\"byte\",\"$5\""
}
ours="void hpc::kernels::(anonymous namespace)::add_kernel<__nv_bfloat16>(const T1 *, T1 *, long)"
for step in 1 2; do
  for k in 1 2 3; do
    launch $((step * 4 + k)) "$ours" "$((step * 1000)),000" "$step,000,000,000" "1,000,000,000"
  done
  launch $((step * 4 + 4)) sm90_xmma_fprop_implicit_gemm "500,000" "500,000,000" "500,000,000"
done >> "$log"
STUB
chmod +x "$gpu/bin/"* "$gpu/build/src/hpctrain" "$gpu/build/bench/gpu_step"
export PATH="$gpu/bin:$PATH" BUILD_DIR="$gpu/build" DATA_DIR="$gpu/data" PYTHON="$gpu/bin/python"

# The second of the two steps, grouped by name: 3 x 2 ms and 3 GB of ours, 0.5 ms and 1 GB of
# cuDNN's; at the stand-in's copy bandwidth of 4 TB/s the 10 GB take 2.5 ms; ours, 9 GB in 6 ms
# (1.5 TB/s), reach 0.375 of it.
: > "$STUB_CALLS"
out=$("$bench/gpu_vs_peer.sh" kernels 2>&1)
expect "$out" "kernels_resnet50_launches=4" "kernels_resnet50_step_ms=6.500" \
  "kernels_resnet50_top=hpc::kernels::add_kernel" "kernels_resnet50_top_share=0.923" \
  "kernels_resnet50_dram_bytes=10000000000" "kernels_resnet50_copy_bandwidth_bytes_per_s=4000000000000" \
  "kernels_resnet50_bytes_time_ms=2.500" "kernels_resnet50_ours_fraction_of_bandwidth=0.375" \
  "resnet50_step_dram_bytes=10000000000" "resnet50_kernels_fraction_of_bandwidth=0.375"
expect "$(cat "$STUB_CALLS")" "gpu_step --copy-bandwidth" \
  "ncu --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum" \
  "gpu_step --model resnet50 --image-size 224 --channels 3 --classes 1000 --precision bf16 --batch 128 --warmup 1 --iters 1"
: > "$STUB_CALLS"
out=$("$bench/gpu_vs_peer.sh" kernels --kernels-model cnn --precision fp16 --batch 64 2>&1)
expect "$out" "kernels_cnn_launches=4"
expect "$(cat "$STUB_CALLS")" "gpu_step --model cnn --batch 64 --precision bf16 --warmup 1 --iters 1"
# bn: the launch choices' totals, the default's and the fastest's.
: > "$STUB_CALLS"
out=$("$bench/gpu_vs_peer.sh" bn --resnet50-batch 64 2>&1)
expect "$out" "bn_tuning_default=8,4,2,1,1024" "bn_tuning_default_resnet50_ms=9.0" "bn_tuning_best=16,2,4,0,256,1" \
  "bn_tuning_best_resnet50_ms=7.5" "bn_tuning_relu_backward_resnet50_ms=2.2"
expect "$(cat "$STUB_CALLS")" "gpu_step --kernel-shapes --batch 64"
# `all` with no time for any step: none starts, each is named, exit 1. The scaling runs kept by
# an earlier scaling step come back packed in --out, without their checkpoint folders.
mkdir -p "$gpu/build/gpu_vs_peer/scaling/ckpt2_on"
echo '[]' > "$gpu/build/gpu_vs_peer/scaling/trace2_on.json"
echo 'x' > "$gpu/build/gpu_vs_peer/scaling/ckpt2_on/state"
out=$("$bench/gpu_vs_peer.sh" all --within 20 --out "$gpu/out" 2>&1)
code=$?
checks=$((checks + 1))
[[ $code == 1 ]] || fail "gpu_vs_peer.sh all --within 20 exited $code, wanted 1" "$out"
expect "$out" "== all: build not run (20 s left of --within 20)" \
  "== all: not passed: build (not run) tests (not run) bn (not run) training (not run) cnn (not run) resnet50 (not run) kernels (not run) scaling (not run) (log: $gpu/out/all.log)"
expect "$(cat "$gpu/out/all.log")" "== all: scaling not run (20 s left of --within 20)" \
  "== all: not passed: build (not run) tests (not run) bn (not run) training (not run) cnn (not run) resnet50 (not run) kernels (not run) scaling (not run) (log: $gpu/out/all.log)"
expect "$(cat "$gpu/out/summary.txt")" "all_steps_not_passed=8"
expect "$(tar -tzf "$gpu/out/scaling.tar.gz" 2>&1 | sort)" "scaling/" "scaling/trace2_on.json"
checks=$((checks + 1))
tar -tzf "$gpu/out/scaling.tar.gz" | grep -q ckpt && fail "scaling.tar.gz holds the checkpoint folders" "$out"
rm -rf "$gpu/build/gpu_vs_peer/scaling"
# scaling: scaling_check.sh's key=value line per check and its count of failed checks in the
# summary, its table not (a stand-in prints lines of both kinds, as the real one does), and a
# failing check script fails the step.
cat > "$gpu/scaling_check" << 'STUB'
#!/bin/sh
echo "scaling_check $*" >> "$STUB_CALLS"
echo "  ranks overlap       step ms    predicted  within     exposed ms      predicted  within"
echo "  2     on             13.196       11.836     yes          0.659          0.128      no"
echo "  4     off            28.014       25.383     yes          3.648          1.966      no"
echo "  resnet101 at 129 img/s on one P100: model 91.6%, published 90%, within 5 points: yes"
echo "scaling_2_ranks_overlap_on=step 13.196 ms predicted 11.836 (yes), exposed 0.659 ms predicted 0.128 (no)"
echo "scaling_4_ranks_overlap_off=step 28.014 ms predicted 25.383 (yes), exposed 3.648 ms predicted 1.966 (no)"
echo "checks_failed=2"
STUB
chmod +x "$gpu/scaling_check"
out=$(SCALING_CHECK=$gpu/scaling_check "$bench/gpu_vs_peer.sh" scaling 2>&1)
expect "$(cat "$gpu/build/gpu_vs_peer/scaling.txt")" "scaling_checks_failed=2" \
  "scaling_2_ranks_overlap_on=step 13.196 ms predicted 11.836 (yes), exposed 0.659 ms predicted 0.128 (no)" \
  "scaling_4_ranks_overlap_off=step 28.014 ms predicted 25.383 (yes), exposed 3.648 ms predicted 1.966 (no)"
expect "$(cat "$STUB_CALLS")" "scaling_check --keep $gpu/build/gpu_vs_peer/scaling"
printf '#!/bin/sh\nexit 3\n' > "$gpu/scaling_check"
SCALING_CHECK=$gpu/scaling_check refuse gpu_vs_peer.sh "bench/scaling_check.sh failed (exit 3)" scaling
# cnn: the headline rows are the trainer's default, its steps replayed as CUDA graphs (gpu_step
# --cuda-graphs; hpctrain without a graphs option), the eager ones (gpu_step without it;
# hpctrain --no-cuda-graphs) beside them, and the two end-to-end runs' checksums compared. The
# stand-ins: gpu_step 300,000 img/s as a graph and 150,000 eager; hpctrain 250,000 and 120,000
# end to end (STUB_OTHER_BITS: the eager run ends with other bits); the peer 100,000 steady and
# 50,000 end to end.
cat > "$gpu/build/bench/gpu_step" << 'STUB'
#!/bin/sh
echo "gpu_step $*" >> "$STUB_CALLS"
case " $* " in
  *" --copy-bandwidth "*) echo '{"workload": "copy", "copy_bytes_per_s": 4000000000000}' ;;
  *" --cuda-graphs "*) echo '{"workload": "cnn", "images_per_s": 300000, "train_flops_per_sample": 1000000}' ;;
  *) echo '{"workload": "cnn", "images_per_s": 150000, "train_flops_per_sample": 1000000}' ;;
esac
STUB
cat > "$gpu/build/src/hpctrain" << 'STUB'
#!/usr/bin/env bash
echo "hpctrain $*" >> "$STUB_CALLS"
metrics= eager=0
while (($#)); do
  [[ $1 == --metrics-file ]] && metrics=$2
  [[ $1 == --no-cuda-graphs ]] && eager=1
  shift
done
rate=250000 bits=00ab
((eager)) && rate=120000 && [[ -n ${STUB_OTHER_BITS:-} ]] && bits=00cd
echo "{\"event\":\"done\",\"images_per_second\":$rate,\"test_accuracy\":0.92,\"param_checksum\":\"$bits\"}" > "$metrics"
STUB
cat > "$gpu/peer_gpu.py" << 'STUB'
print('{"images_per_s": 50000, "test_acc": 0.921}')
STUB
cat > "$gpu/bin/python" << STUB
#!/usr/bin/env bash
[[ \$1 == -c && \$2 == *nvidia.* ]] && { echo "$gpu/nv"; exit 0; }
[[ \$1 == -c ]] && exit 0
[[ \$1 == */torch_gpu_steps.py ]] && { echo '{"images_per_s": 100000}'; exit 0; }
exec /usr/bin/python3 "\$@"
STUB
chmod +x "$gpu/build/bench/gpu_step" "$gpu/build/src/hpctrain" "$gpu/bin/python"
: > "$STUB_CALLS"
out=$(PEER_GPU=$gpu/peer_gpu.py "$bench/gpu_vs_peer.sh" cnn 2>&1)
expect "$(cat "$gpu/build/gpu_vs_peer/cnn.txt")" "cnn_steady_hpctrain_images_per_second=300000" \
  "cnn_steady_ratio_hpctrain_over_peer=3.00" "cnn_steady_cuda_graphs_ratio_over_peer=3.00" \
  "cnn_steady_hpctrain_eager_images_per_second=150000" "cnn_steady_eager_ratio_over_peer=1.50" \
  "cnn_e2e_hpctrain_images_per_second=250000" "cnn_e2e_ratio_hpctrain_over_peer=5.00" \
  "cnn_e2e_hpctrain_eager_images_per_second=120000" "cnn_e2e_eager_ratio_over_peer=2.40" \
  "cnn_e2e_hpctrain_cuda_graphs_same_checksum=yes" "cnn_e2e_peer_test_accuracy=0.921"
calls=$(sed 's/ --metrics-file .*//' "$STUB_CALLS")
expect "$calls" "gpu_step --model cnn --batch 128 --precision tf32 --cuda-graphs" \
  "gpu_step --model cnn --batch 128 --precision tf32" \
  "hpctrain --device cuda --batch-size 128 --epochs 4 --precision tf32 --data-dir $gpu/data" \
  "hpctrain --device cuda --batch-size 128 --epochs 4 --precision tf32 --data-dir $gpu/data --no-cuda-graphs"
out=$(STUB_OTHER_BITS=1 PEER_GPU=$gpu/peer_gpu.py "$bench/gpu_vs_peer.sh" cnn 2>&1)
expect "$(cat "$gpu/build/gpu_vs_peer/cnn.txt")" "cnn_e2e_hpctrain_cuda_graphs_same_checksum=no"
# resnet50: the headline rows the default (gpu_step --cuda-graphs; hpctrain without a graphs
# option), the eager ones beside them, then the JPEG run: its last epoch's rate over the
# synthetic default's and its steps' wait for batches as a share of their time. The stand-ins:
# gpu_step as above (300,000 and 150,000 img/s), the peer 100,000 (eager and compiled), hpctrain
# end to end 6,000 img/s by default, 5,000 with --no-cuda-graphs and 5,500 on JPEG shards, whose
# last epoch's three steps of 20 ms waited 2 ms each (the first epoch's 10 ms, which must not
# count); loader_throughput and hpcdata-pack only say they were called.
cat > "$gpu/build/src/hpctrain" << 'STUB'
#!/usr/bin/env bash
echo "hpctrain $*" >> "$STUB_CALLS"
metrics= rate=6000 jpeg=0
while (($#)); do
  [[ $1 == --metrics-file ]] && metrics=$2
  [[ $1 == --no-cuda-graphs ]] && rate=5000
  [[ $1 == --jpeg-decode ]] && rate=5500 jpeg=1
  shift
done
for epoch in 1 2; do
  wait=0.010
  ((epoch == 2)) && wait=0.002
  ((jpeg)) && for step in 1 2 3; do
    echo "{\"event\":\"step\",\"step\":$step,\"data_wait_seconds\":$wait,\"step_seconds\": 0.020}"
  done
  echo "{\"event\":\"epoch\",\"epoch\":$epoch,\"images_per_second\":$((rate - (2 - epoch) * 1000))}"
done > "$metrics"
STUB
printf '#!/bin/sh\necho "loader_throughput $*" >> "$STUB_CALLS"\nmkdir -p "$2"\n' > "$gpu/build/bench/loader_throughput"
mkdir -p "$gpu/build/datasets"
printf '#!/bin/sh\necho "hpcdata-pack $*" >> "$STUB_CALLS"\n' > "$gpu/build/datasets/hpcdata-pack"
chmod +x "$gpu/build/src/hpctrain" "$gpu/build/bench/loader_throughput" "$gpu/build/datasets/hpcdata-pack"
: > "$STUB_CALLS"
out=$(PEER_GPU=$gpu/peer_gpu.py "$bench/gpu_vs_peer.sh" resnet50 2>&1) || fail "gpu_vs_peer.sh resnet50 failed" "$out"
expect "$(cat "$gpu/build/gpu_vs_peer/resnet50.txt")" "resnet50_steady_hpctrain_images_per_second=300000" \
  "resnet50_steady_hpctrain_eager_images_per_second=150000" "resnet50_steady_peer_eager_images_per_second=100000" \
  "resnet50_steady_ratio_over_peer_eager=3.00" "resnet50_steady_ratio_over_peer_compile=3.00" \
  "resnet50_steady_eager_ratio_over_peer_compile=1.50" "resnet50_e2e_hpctrain_images_per_second=6000" \
  "resnet50_e2e_hpctrain_eager_images_per_second=5000" "resnet50_jpeg_e2e_images_per_second=5500" \
  "resnet50_jpeg_e2e_ratio_over_synthetic=0.92" "resnet50_jpeg_e2e_data_wait_share=0.100" \
  "resnet50_jpeg_e2e_ratio_target=0.9"
calls=$(sed 's/ --metrics-file .*//; s/ --data-dir [^ ]*/ --data-dir D/; s| [^ ]*/jpegs/| T/jpegs/|g' "$STUB_CALLS")
r50="--image-size 224 --precision bf16 --no-deterministic"
expect "$calls" "gpu_step --model resnet50 --image-size 224 --channels 3 --classes 1000 --precision bf16 --batch 128 --no-deterministic --cuda-graphs" \
  "gpu_step --model resnet50 --image-size 224 --channels 3 --classes 1000 --precision bf16 --batch 128 --no-deterministic" \
  "hpctrain --device cuda --model resnet50 --dataset synthetic $r50 --batch-size 128 --epochs 4 --test-samples 128" \
  "hpctrain --device cuda --model resnet50 --dataset synthetic $r50 --batch-size 128 --epochs 4 --test-samples 128 --no-cuda-graphs" \
  "loader_throughput --make-jpegs T/jpegs/src --images 4096 --source 375x500" \
  "hpcdata-pack T/jpegs/src T/jpegs/packed --split train" "hpcdata-pack T/jpegs/src T/jpegs/packed --split val" \
  "hpctrain --device cuda --model resnet50 --dataset shards --data-dir D $r50 --jpeg-decode gpu --batch-size 128 --epochs 3 --test-samples 128"

# Refusals: each one line and exit 2.
NCU_EMPTY=1 refuse gpu_vs_peer.sh "could not read ncu's measurements: ncu recorded no kernel durations (gpu__time_duration.sum)" kernels
refuse gpu_vs_peer.sh "--kernels-model must be resnet50 or cnn, got 'vgg'" kernels --kernels-model vgg
refuse gpu_vs_peer.sh "the first argument must be a step: build, tests, bn, training, cnn, resnet50, kernels, scaling, summary or all (try --help)" profile
refuse gpu_vs_peer.sh "--bn-tuning must be best or PACK_BYTES,BLOCKS_PER_SM,ROWS,ONE_WAVE[,SUM_BLOCKS[,FUSED]] (as 8,4,2,1,1024), got 'fast'" all --bn-tuning fast
refuse gpu_vs_peer.sh "--bn-tuning must be best or PACK_BYTES,BLOCKS_PER_SM,ROWS,ONE_WAVE[,SUM_BLOCKS[,FUSED]] (as 8,4,2,1,1024), got '8,4,2,1,1024,2'" all --bn-tuning 8,4,2,1,1024,2
refuse gpu_vs_peer.sh "--within must be a positive integer, got '0'" all --within 0
BUILD_DIR=$tmp/none refuse gpu_vs_peer.sh "no GPU build in $tmp/none (run: bench/gpu_vs_peer.sh build)" kernels
DEPS=$tmp/none refuse gpu_vs_peer.sh \
  "no $tmp/none/deps.tar.xz (DEPS: the folder bench/device_deps.sh pack made, carried here)" build
# A pack env cannot unpack: its one error line, exit 2, and no step goes on without the pack.
mkdir -p "$tmp/damaged"
echo "not xz" > "$tmp/damaged/deps.tar.xz"
out=$(DEPS=$tmp/damaged HPCTRAIN_DEPS=$tmp/damaged/unpacked "$bench/gpu_vs_peer.sh" build 2>&1 > /dev/null)
code=$?
checks=$((checks + 1))
[[ $code == 2 && $out == "device_deps.sh: error: cannot unpack $tmp/damaged/deps.tar.xz "* && $out != *$'\n'* ]] ||
  fail "gpu_vs_peer.sh build with a damaged DEPS pack exited $code, wanted 2 and env's one error line" "$out"
printf '#!/bin/sh\nexit 9\n' > "$gpu/bin/nvidia-smi"
refuse gpu_vs_peer.sh "no NVIDIA GPU here (nvidia-smi -L failed)" kernels

echo "$checks checks, $failures failed"
((failures == 0))

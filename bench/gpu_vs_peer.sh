#!/usr/bin/env bash
# hpctrain against its PyTorch peer on one NVIDIA GPU, in one invocation on one machine (the
# device machine): builds hpctrain with CUDA, cuDNN and NCCL, runs the GPU tests (ctest -L gpu),
# then
#   1. hpctrain --device cuda on the peer's cnn recipe (Fashion-MNIST, batch 128, 3 epochs),
#      and again with --cuda-graphs (its rate, and whether it ends with the same checksum);
#   2. the peer, torch_peer_gpu.py cnn, the same work in PyTorch eager, same precision;
# and prints both throughputs, their ratio (target: hpctrain / peer >= 3.0) and both accuracies;
#   3. hpctrain --model resnet50 on synthetic 224x224 data (--dataset synthetic), bf16, NHWC
#      (hpctrain's only layout), its last epoch's training images/s;
#   4. the peer's resnet50 workload, bf16 autocast, channels-last, eager and torch.compile;
# and prints those throughputs, the ratios (target >= 1.0 against both) and each side's
# model-FLOPs utilisation (hpctrain's FLOPs per sample over the GPU's dense bf16 peak).
#
# Usage: bench/gpu_vs_peer.sh [--epochs E] [--batch B] [--precision fp32|tf32|bf16|fp16]
#          [--resnet50-batch B] [--no-resnet50] [--no-compile] [--no-build] [--no-tests]
# Environment: BUILD_DIR (default build-gpu), DEPS (a folder from `bench/device_deps.sh pack`:
#   build dependencies, the dataset and the peer script, for machines without them),
#   DATA_DIR (Fashion-MNIST .gz files; default $DEPS/fashion-mnist, else Debian's location),
#   PEER_GPU (default $DEPS/torch_peer_gpu.py, else ../shared/bench/torch_peer_gpu.py),
#   PYTHON (default python3: the one with PyTorch on the device machine).
# On the device machine, in one call:  bash bench/gpu_vs_peer.sh   with DEPS=.device carried.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

epochs=3 batch=128 precision=tf32 build=1 tests=1 r50_batch=128 resnet50=1 compile=1
while (($#)); do
  case "$1" in
    --epochs) [[ $# -ge 2 ]] || die "--epochs needs a value"; epochs=$2; shift 2 ;;
    --batch) [[ $# -ge 2 ]] || die "--batch needs a value"; batch=$2; shift 2 ;;
    --precision) [[ $# -ge 2 ]] || die "--precision needs a value"; precision=$2; shift 2 ;;
    --resnet50-batch) [[ $# -ge 2 ]] || die "--resnet50-batch needs a value"; r50_batch=$2; shift 2 ;;
    --no-resnet50) resnet50=0; shift ;;
    --no-compile) compile=0; shift ;;
    --no-build) build=0; shift ;;
    --no-tests) tests=0; shift ;;
    -h | --help) sed -n '2,23s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) die "unknown option '$1' (try --help)" ;;
  esac
done
require_count --epochs "$epochs"
require_count --batch "$batch"
require_count --resnet50-batch "$r50_batch"
[[ $precision =~ ^(fp32|tf32|bf16|fp16)$ ]] || die "--precision must be fp32, tf32, bf16 or fp16, got '$precision'"
command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1 || die "no NVIDIA GPU here (nvidia-smi -L failed)"

cmake_args=()
if [[ -n "${DEPS:-}" ]]; then
  [[ "$DEPS" == /* ]] || DEPS="$root/$DEPS"
  eval "$("$root/bench/device_deps.sh" env "$DEPS")"
  read -r -a cmake_args <<< "$HPCTRAIN_DEPS_CMAKE_ARGS"
fi
# cuDNN and NCCL: the CUDA toolkit's own, else the ones PyTorch's wheels bring (nvidia.cudnn,
# nvidia.nccl), whose libraries carry only versioned names.
python=${PYTHON:-python3}
if [[ ! -f /usr/local/cuda/include/cudnn.h ]]; then
  for pkg in cudnn:cudnn.h:libcudnn.so.9:CUDNN nccl:nccl.h:libnccl.so.2:NCCL; do
    IFS=: read -r mod header lib var <<< "$pkg"
    dir=$("$python" -c "import nvidia.$mod as m; print(list(m.__path__)[0])" 2> /dev/null) ||
      die "no $header in /usr/local/cuda and no nvidia.$mod Python package"
    [[ -f $dir/include/$header && -f $dir/lib/$lib ]] || die "nvidia.$mod at $dir lacks include/$header or lib/$lib"
    cmake_args+=("-DHPCTRAIN_HAVE_${var}_INCLUDE=$dir/include" "-DHPCTRAIN_HAVE_${var}_LIBRARY=$dir/lib/$lib")
    export LD_LIBRARY_PATH=$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  done
fi
data=${DATA_DIR:-${DEPS:+$DEPS/fashion-mnist}}
data=${data:-/usr/share/datasets/fashion-mnist}
[[ -f $data/train-images-idx3-ubyte.gz ]] || die "no Fashion-MNIST in $data (set DATA_DIR or DEPS)"
peer=${PEER_GPU:-${DEPS:+$DEPS/torch_peer_gpu.py}}
peer=${peer:-$root/../shared/bench/torch_peer_gpu.py}
[[ -f $peer ]] || die "no GPU peer script at $peer (set PEER_GPU or DEPS)"
"$python" -c 'import torch; assert torch.cuda.is_available()' 2> /dev/null || die "$python has no PyTorch with CUDA"

build_dir=${BUILD_DIR:-build-gpu}
[[ "$build_dir" == /* ]] || build_dir="$root/$build_dir"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "gpu_vs_peer: $(nvidia-smi -L | head -n 1); $epochs epoch(s), batch $batch, $precision"
if ((build)); then
  echo "== build: $build_dir"
  cmake -S "$root" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DHPCTRAIN_CUDA=ON -DHPCTRAIN_CUDNN=ON \
    -DHPCTRAIN_NCCL=ON -DHPCTRAIN_TEST_FASHION_MNIST_DIR="$data" "${cmake_args[@]}" > "$build_dir.cmake.log" 2>&1 ||
    { tail -n 30 "$build_dir.cmake.log"; die "cmake failed (log: $build_dir.cmake.log)"; }
  cmake --build "$build_dir" -j "$(nproc)" 2>&1 | tail -n 5
fi
hpctrain=$build_dir/src/hpctrain
[[ -x $hpctrain ]] || die "no hpctrain at $hpctrain"
if ((tests)); then
  echo "== GPU tests: ctest -L gpu"
  (cd "$build_dir" && ctest -L gpu --output-on-failure --timeout 600) || echo "GPU TESTS FAILED (above); benchmarking anyway"
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo
echo "== 1/4 hpctrain --device cuda --batch-size $batch --epochs $epochs --precision $precision"
"$hpctrain" --device cuda --batch-size "$batch" --epochs "$epochs" --precision "$precision" --data-dir "$data" \
  --metrics-file "$tmp/m.jsonl" 2>&1 | sed -u 's/^/  /'
done_line=$(grep '"event":"done"' "$tmp/m.jsonl" | tail -n 1)
[[ -n "$done_line" ]] || die "hpctrain wrote no done line"
ours_ips=$(json_number images_per_second <<< "$done_line")
ours_acc=$(json_number test_accuracy <<< "$done_line")
ours_sum=$(sed -n 's/.*"param_checksum":"\([0-9a-f]*\)".*/\1/p' <<< "$done_line")

# The same run replaying each step as one CUDA graph (fp16 is not captured: its loss scale moves).
graphs_summary="hpctrain_cuda_graphs=skipped (--precision fp16)"
if [[ $precision != fp16 ]]; then
  echo
  echo "== 1b/4 the same with --cuda-graphs"
  "$hpctrain" --device cuda --batch-size "$batch" --epochs "$epochs" --precision "$precision" --data-dir "$data" \
    --cuda-graphs --metrics-file "$tmp/g.jsonl" 2>&1 | sed -u 's/^/  /'
  g_line=$(grep '"event":"done"' "$tmp/g.jsonl" | tail -n 1)
  [[ -n "$g_line" ]] || die "hpctrain --cuda-graphs wrote no done line"
  g_ips=$(json_number images_per_second <<< "$g_line")
  g_sum=$(sed -n 's/.*"param_checksum":"\([0-9a-f]*\)".*/\1/p' <<< "$g_line")
  graphs_summary="hpctrain_cuda_graphs_images_per_second=$(calc "$g_ips" 1)
hpctrain_cuda_graphs_same_checksum=$([[ "$g_sum" == "$ours_sum" ]] && echo yes || echo no)"
fi

echo
# The peer's autocast knows fp32, tf32 and bf16; fp16 runs it in bf16, the nearest it has.
peer_precision=$precision
[[ $precision == fp16 ]] && peer_precision=bf16
echo "== 2/4 peer: $python $peer cnn --batch $batch --epochs $epochs --precision $peer_precision"
PYTHONUNBUFFERED=1 "$python" "$peer" cnn --data-dir "$data" --batch "$batch" --epochs "$epochs" \
  --precision "$peer_precision" 2>&1 | tee "$tmp/peer.log" | sed -u 's/^/  /'
peer_line=$(grep '"images_per_s"' "$tmp/peer.log" | tail -n 1)
[[ -n "$peer_line" ]] || die "the peer printed no result line"
peer_ips=$(json_number images_per_s <<< "$peer_line")
peer_acc=$(json_number test_acc <<< "$peer_line")

ratio=$(calc "$ours_ips / $peer_ips" 2)
met=$(awk "BEGIN { print ($ours_ips / $peer_ips >= 3.0) ? \"yes\" : \"no\" }")
[[ -n "${g_ips:-}" ]] && graphs_summary+="
ratio_cuda_graphs_over_peer=$(calc "$g_ips / $peer_ips" 2)"

# ResNet-50, bf16. hpctrain: 4 epochs of the 2048 synthetic images; the last epoch's rate
# (cuDNN's algorithm choice and the allocator's first requests fall in the first). The peer:
# 15 warm-up steps, then 50 timed.
r50_summary="resnet50_bf16=skipped (--no-resnet50)"
if ((resnet50)); then
  echo
  echo "== 3/4 hpctrain --model resnet50 --dataset synthetic --image-size 224 --precision bf16 --batch-size $r50_batch"
  "$hpctrain" --device cuda --model resnet50 --dataset synthetic --image-size 224 --precision bf16 \
    --no-deterministic --batch-size "$r50_batch" --epochs 4 --test-samples "$r50_batch" \
    --metrics-file "$tmp/r50.jsonl" 2>&1 | sed -u 's/^/  /'
  r50_epoch=$(grep '"event":"epoch"' "$tmp/r50.jsonl" | tail -n 1)
  r50_done=$(grep '"event":"done"' "$tmp/r50.jsonl" | tail -n 1)
  [[ -n "$r50_epoch" && -n "$r50_done" ]] || die "hpctrain's resnet50 run wrote no epoch or done line"
  r50_ours=$(json_number images_per_second <<< "$r50_epoch")
  r50_flops=$(json_number train_flops_per_sample <<< "$r50_done")
  echo
  r50_peer=() r50_modes=(eager)
  ((compile)) && r50_modes+=(compile)
  for mode in "${r50_modes[@]}"; do
    flag=()
    [[ $mode == compile ]] && flag=(--compile)
    echo "== 4/4 peer: $python $peer resnet50 --precision bf16 --channels-last --batch $r50_batch ${flag[*]}"
    PYTHONUNBUFFERED=1 "$python" "$peer" resnet50 --precision bf16 --channels-last --batch "$r50_batch" \
      "${flag[@]}" 2>&1 | tee "$tmp/r50peer.log" | sed -u 's/^/  /'
    line=$(grep '"images_per_s"' "$tmp/r50peer.log" | tail -n 1)
    [[ -n "$line" ]] || die "the peer's resnet50 ($mode) printed no result line"
    r50_peer+=("$(json_number images_per_s <<< "$line")")
  done
  # Dense bf16 tensor-core peaks (FLOP/s) of the GPUs these benchmarks meet.
  gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
  case "$gpu_name" in
    *H100*PCIe*) peak=756e12 ;;
    *H100* | *H200*) peak=989e12 ;;
    *A100*) peak=312e12 ;;
    *L40S*) peak=362e12 ;;
    *A10G*) peak=70e12 ;;
    *) peak=0 ;;
  esac
  mfu() { if [[ $peak == 0 ]]; then echo "unknown (no peak for $gpu_name)"; else calc "$1 * $r50_flops / $peak" 3; fi; }
  r50_summary="resnet50_bf16_batch=$r50_batch
resnet50_hpctrain_images_per_second=$(calc "$r50_ours" 1)
resnet50_hpctrain_mfu=$(mfu "$r50_ours")
resnet50_train_flops_per_sample=$r50_flops"
  for i in "${!r50_modes[@]}"; do
    r50_summary+="
resnet50_peer_${r50_modes[$i]}_images_per_second=$(calc "${r50_peer[$i]}" 1)
resnet50_peer_${r50_modes[$i]}_mfu=$(mfu "${r50_peer[$i]}")
resnet50_ratio_over_peer_${r50_modes[$i]}=$(calc "$r50_ours / ${r50_peer[$i]}" 2)"
  done
  r50_summary+="
resnet50_ratio_target=1.0"
fi
echo
echo "== summary"
cat << EOS
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
precision=$precision
batch=$batch
epochs=$epochs
hpctrain_images_per_second=$(calc "$ours_ips" 1)
hpctrain_test_accuracy=$ours_acc
peer_images_per_second=$(calc "$peer_ips" 1)
peer_test_accuracy=$peer_acc
ratio_hpctrain_over_peer=$ratio
ratio_target=3.0
ratio_target_met=$met
$graphs_summary
$r50_summary
EOS

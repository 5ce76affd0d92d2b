#!/usr/bin/env bash
# hpctrain against its PyTorch peer on one NVIDIA GPU, in one invocation on one machine (the
# device machine): builds hpctrain with CUDA, cuDNN and NCCL, runs the GPU tests (ctest -L gpu),
# then
#   1. hpctrain --device cuda on the peer's cnn recipe (Fashion-MNIST, batch 128, 3 epochs);
#   2. the peer, torch_peer_gpu.py cnn, the same work in PyTorch eager, same precision;
# and prints both throughputs, their ratio (target: hpctrain / peer >= 3.0) and both accuracies.
# ResNet-50 (bf16, channels-last) is not compared yet: hpctrain has no resnet50 model nor bf16.
#
# Usage: bench/gpu_vs_peer.sh [--epochs E] [--batch B] [--precision fp32|tf32] [--no-build] [--no-tests]
# Environment: BUILD_DIR (default build-gpu), DEPS (a folder from `bench/device_deps.sh pack`:
#   build dependencies, the dataset and the peer script, for machines without them),
#   DATA_DIR (Fashion-MNIST .gz files; default $DEPS/fashion-mnist, else Debian's location),
#   PEER_GPU (default $DEPS/torch_peer_gpu.py, else ../shared/bench/torch_peer_gpu.py),
#   PYTHON (default python3: the one with PyTorch on the device machine).
# On the device machine, in one call:  bash bench/gpu_vs_peer.sh   with DEPS=.device carried.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

epochs=3 batch=128 precision=tf32 build=1 tests=1
while (($#)); do
  case "$1" in
    --epochs) [[ $# -ge 2 ]] || die "--epochs needs a value"; epochs=$2; shift 2 ;;
    --batch) [[ $# -ge 2 ]] || die "--batch needs a value"; batch=$2; shift 2 ;;
    --precision) [[ $# -ge 2 ]] || die "--precision needs a value"; precision=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    --no-tests) tests=0; shift ;;
    -h | --help) sed -n '2,17s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) die "unknown option '$1' (try --help)" ;;
  esac
done
require_count --epochs "$epochs"
require_count --batch "$batch"
[[ $precision == fp32 || $precision == tf32 ]] || die "--precision must be fp32 or tf32, got '$precision'"
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
echo "== 1/2 hpctrain --device cuda --batch-size $batch --epochs $epochs --precision $precision"
"$hpctrain" --device cuda --batch-size "$batch" --epochs "$epochs" --precision "$precision" --data-dir "$data" \
  --metrics-file "$tmp/m.jsonl" 2>&1 | sed -u 's/^/  /'
done_line=$(grep '"event":"done"' "$tmp/m.jsonl" | tail -n 1)
[[ -n "$done_line" ]] || die "hpctrain wrote no done line"
ours_ips=$(json_number images_per_second <<< "$done_line")
ours_acc=$(json_number test_accuracy <<< "$done_line")

echo
echo "== 2/2 peer: $python $peer cnn --batch $batch --epochs $epochs --precision $precision"
PYTHONUNBUFFERED=1 "$python" "$peer" cnn --data-dir "$data" --batch "$batch" --epochs "$epochs" \
  --precision "$precision" 2>&1 | tee "$tmp/peer.log" | sed -u 's/^/  /'
peer_line=$(grep '"images_per_s"' "$tmp/peer.log" | tail -n 1)
[[ -n "$peer_line" ]] || die "the peer printed no result line"
peer_ips=$(json_number images_per_s <<< "$peer_line")
peer_acc=$(json_number test_acc <<< "$peer_line")

ratio=$(calc "$ours_ips / $peer_ips" 2)
met=$(awk "BEGIN { print ($ours_ips / $peer_ips >= 3.0) ? \"yes\" : \"no\" }")
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
resnet50_bf16=not compared: hpctrain has no resnet50 model or bf16 yet
EOS

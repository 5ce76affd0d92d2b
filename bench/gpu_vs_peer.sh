#!/usr/bin/env bash
# The GPU procedure, on a machine with one NVIDIA GPU (the device machine), in steps that each
# end well inside the 10 minutes one command may take there; each step is resumable on a warm
# machine (the build is incremental, a step reads only the build and the data). Durations as
# measured on one H200 with 16 cores (2026-11-25; bench/README.md, "What the first run gave").
#
#   bench/gpu_vs_peer.sh build      ~1 min  configure and build hpctrain with CUDA, cuDNN and NCCL
#                                          into build-gpu/ (hpctrain, the GPU tests, gpu_step)
#   bench/gpu_vs_peer.sh tests      ~15 s   ctest -L gpu without GpuTraining: every kernel and
#                                          layer against the CPU, the NCCL communicator
#   bench/gpu_vs_peer.sh training   ~2 min  ctest -R GpuTraining: the default job's 92% on one GPU,
#                                          exact resume, CPU parity, the bucketed NCCL path
#                                          (HPCTRAIN_TEST_FORCE_NCCL=1), mpirun, CUDA graphs, predict
#   bench/gpu_vs_peer.sh cnn        ~45 s   cnn, Fashion-MNIST: hpctrain against the PyTorch peer,
#                                          steady steps with the batch on the GPU (gpu_step
#                                          replayed as a CUDA graph, as the trainer does by
#                                          default, and launched one by one; torch_gpu_steps.py,
#                                          same steps), then end to end (the trainer with its
#                                          loader, copies and evaluation, also --no-cuda-graphs,
#                                          and the peer's training loop over data held on the GPU)
#   bench/gpu_vs_peer.sh resnet50   3.2 min ResNet-50, 224x224, bf16: steady steps both sides
#                                          (the peer eager and compiled; ours replayed as a CUDA
#                                          graph, and eager), hpctrain end to end on
#                                          --dataset synthetic, then on JPEG shards made here and
#                                          decoded on the GPU (--jpeg-decode gpu); MFU of each
#   bench/gpu_vs_peer.sh bn         ~25 s   the batch-norm passes' launch choices timed on
#                                          ResNet-50's 53 batch-norm shapes (gpu_step --kernel-shapes):
#                                          the default's time, the fastest choice and its time
#   bench/gpu_vs_peer.sh kernels    ~30 s   the roofline of one training step: Nsight Compute (ncu)
#                                          measures every kernel launch of a gpu_step step, its
#                                          time and DRAM bytes (read + written), grouped by kernel
#                                          name, largest first, each group's bandwidth as a fraction
#                                          of the GPU's measured copy bandwidth (gpu_step
#                                          --copy-bandwidth); the step's bytes, their time at that
#                                          bandwidth, and our kernels' (hpc::kernels) fraction
#                                          together (bench/ncu_kernels.py; --kernels-model
#                                          resnet50, the default, or cnn)
#   bench/gpu_vs_peer.sh scaling    ~1 min  the scaling model against this machine's CPU ranks
#                                          (bench/scaling_check.sh: 2, 3 and 4 ranks of the
#                                          cnn on the CPU, with a core for each rank and its
#                                          communication thread, which the 2-core development
#                                          machine lacks); its checks_failed and a line per check
#   bench/gpu_vs_peer.sh summary            every step's key=value lines so far
#   bench/gpu_vs_peer.sh all        the eight steps in order as one command (build, tests, bn,
#                                          training, cnn, resnet50, kernels, scaling), each under the time
#                                          left of --within S seconds (default 540; a step with
#                                          under 30 s left is not started), with up to 4 CTest
#                                          tests at a time; stops after a failed build. All output
#                                          goes to DIR/all.log and the key=value lines to
#                                          DIR/summary.txt (--out DIR, default BUILD_DIR/gpu_vs_peer),
#                                          the scaling runs' traces and metrics to DIR/scaling.tar.gz:
#                                          three files, for a device call's $OUT. Exit 1 if a step
#                                          failed or was not run.
#
# Options: --precision fp32|tf32|bf16|fp16 (cnn; default tf32), --batch B (cnn, 128),
#   --epochs E (cnn end to end, 4: the default job), --resnet50-batch B (128), --no-compile (resnet50),
#   --within S and --out DIR (all), --kernels-model resnet50|cnn (kernels; the cnn at --batch and
#   --precision, ResNet-50 at --resnet50-batch in bf16), --bn-tuning best|P,B,R,W[,S[,F]] (all: the steps
#   after bn run with HPCTRAIN_BN_TUNING set to bn's fastest choice, or to the one given; the
#   resnet50 step then also times its steady step with the default launch, side by side).
# Environment: BUILD_DIR (default build-gpu), DEPS (a folder from `bench/device_deps.sh pack`:
#   build dependencies, the dataset and the peer script, for machines without them),
#   DATA_DIR (Fashion-MNIST .gz files; default $DEPS/fashion-mnist, else Debian's location),
#   PEER_GPU (default $DEPS/torch_peer_gpu.py, else ../shared/bench/torch_peer_gpu.py),
#   PYTHON (default python3: the one with PyTorch on the device machine), SCALING_CHECK (the
#   scaling step's script, default bench/scaling_check.sh; a stand-in in tests).
# Each step prints its key=value lines last and keeps them in BUILD_DIR/gpu_vs_peer/STEP.txt.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

step=${1:-}
[[ $step =~ ^(build|tests|bn|training|cnn|resnet50|kernels|scaling|summary|all|-h|--help)$ ]] ||
  die "the first argument must be a step: build, tests, bn, training, cnn, resnet50, kernels, scaling, summary or all (try --help)"
shift
[[ $step == -h || $step == --help ]] && { sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0; }
epochs=4 batch=128 precision=tf32 r50_batch=128 compile=1 within=540 out_dir= kernels_model=resnet50 bn_tuning=
step_args=("$@")  # a step of `all` gets the same options (a single step ignores --within and --out)
while (($#)); do
  case "$1" in
    --within) [[ $# -ge 2 ]] || die "--within needs a value"; within=$2; shift 2 ;;
    --out) [[ $# -ge 2 && -n "$2" ]] || die "--out needs a folder"; out_dir=$2; shift 2 ;;
    --epochs) [[ $# -ge 2 ]] || die "--epochs needs a value"; epochs=$2; shift 2 ;;
    --batch) [[ $# -ge 2 ]] || die "--batch needs a value"; batch=$2; shift 2 ;;
    --precision) [[ $# -ge 2 ]] || die "--precision needs a value"; precision=$2; shift 2 ;;
    --resnet50-batch) [[ $# -ge 2 ]] || die "--resnet50-batch needs a value"; r50_batch=$2; shift 2 ;;
    --no-compile) compile=0; shift ;;
    --kernels-model) [[ $# -ge 2 ]] || die "--kernels-model needs a value"; kernels_model=$2; shift 2 ;;
    --bn-tuning) [[ $# -ge 2 ]] || die "--bn-tuning needs a value"; bn_tuning=$2; shift 2 ;;
    *) die "unknown option '$1' (try --help)" ;;
  esac
done
require_count --epochs "$epochs"
require_count --batch "$batch"
require_count --resnet50-batch "$r50_batch"
require_count --within "$within"
[[ $precision =~ ^(fp32|tf32|bf16|fp16)$ ]] || die "--precision must be fp32, tf32, bf16 or fp16, got '$precision'"
[[ $kernels_model =~ ^(resnet50|cnn)$ ]] || die "--kernels-model must be resnet50 or cnn, got '$kernels_model'"
[[ -z $bn_tuning || $bn_tuning == best || $bn_tuning =~ ^[0-9]+,[0-9]+,[0-9]+,[01](,[0-9]+(,[01])?)?$ ]] ||
  die "--bn-tuning must be best or PACK_BYTES,BLOCKS_PER_SM,ROWS,ONE_WAVE[,SUM_BLOCKS[,FUSED]] (as 8,4,2,1,1024), got '$bn_tuning'"
# gpu_step's and the peer's precision: their autocast knows fp32, tf32 and bf16; fp16 runs them
# in bf16, the nearest they have (the trainer itself runs fp16).
peer_precision=$precision
[[ $precision == fp16 ]] && peer_precision=bf16

build_dir=${BUILD_DIR:-build-gpu}
[[ "$build_dir" == /* ]] || build_dir="$root/$build_dir"
results=$build_dir/gpu_vs_peer
if [[ $step == summary ]]; then
  ls "$results"/*.txt > /dev/null 2>&1 || die "no step has finished yet (no $results/*.txt)"
  cat "$results"/*.txt
  exit 0
fi
if ! command -v nvidia-smi > /dev/null || ! nvidia-smi -L > /dev/null 2>&1; then
  die "no NVIDIA GPU here (nvidia-smi -L failed)"
fi

# ---- the environment every step needs: the dependency pack, cuDNN and NCCL, data, peer ----
cmake_args=()
if [[ -n "${DEPS:-}" ]]; then
  [[ "$DEPS" == /* ]] || DEPS="$root/$DEPS"
  [[ -f $DEPS/deps.tar.xz ]] || die "no $DEPS/deps.tar.xz (DEPS: the folder bench/device_deps.sh pack made, carried here)"
  # (eval "$(...)" would go on after a failed env: its status is lost in the substitution.)
  env_lines=$("$root/bench/device_deps.sh" env "$DEPS") || exit 2  # its error said why
  eval "$env_lines"
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
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
hpctrain=$build_dir/src/hpctrain gpu_step=$build_dir/bench/gpu_step
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$results"

need_build() { [[ -x $hpctrain && -x $gpu_step ]] || die "no GPU build in $build_dir (run: bench/gpu_vs_peer.sh build)"; }
need_peer() {
  peer=${PEER_GPU:-${DEPS:+$DEPS/torch_peer_gpu.py}}
  peer=${peer:-$root/../shared/bench/torch_peer_gpu.py}
  [[ -f $peer ]] || die "no GPU peer script at $peer (set PEER_GPU or DEPS)"
  "$python" -c 'import torch; assert torch.cuda.is_available()' 2> /dev/null || die "$python has no PyTorch with CUDA"
}
# report KEY=VALUE lines: printed, and kept as this step's result.
report() {
  { echo "# $step on $gpu_name"; cat; } > "$results/$step.txt"
  echo
  echo "== $step: summary"
  cat "$results/$step.txt"
}
json_line() { grep "\"$1\"" "$2" | tail -n 1; }
checksum() { sed -n 's/.*"param_checksum": \{0,1\}"\([0-9a-f]*\)".*/\1/p'; }

# Dense tensor-core peaks (FLOP/s) of the GPUs these benchmarks meet: bf16 (and fp16), and TF32
# (half of it); fp32 without tensor cores is not an MFU anyone quotes.
peak_of() {
  local bf16
  case "$gpu_name" in
    *H100*PCIe*) bf16=756e12 ;;
    *H100* | *H200*) bf16=989e12 ;;
    *A100*) bf16=312e12 ;;
    *L40S*) bf16=362e12 ;;
    *A10G*) bf16=70e12 ;;
    *) echo 0; return ;;
  esac
  case "$1" in
    bf16 | fp16) echo "$bf16" ;;
    tf32) awk "BEGIN { print $bf16 / 2 }" ;;
    *) echo 0 ;;
  esac
}
# mfu IMAGES_PER_S FLOPS_PER_SAMPLE PRECISION
mfu() {
  local peak
  peak=$(peak_of "$3")
  if [[ $peak == 0 ]]; then echo "unknown (no $3 peak for $gpu_name)"; else calc "$1 * $2 / $peak" 3; fi
}

build_step() {
  echo "== build: $build_dir ($gpu_name)"
  cmake -S "$root" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DHPCTRAIN_CUDA=ON -DHPCTRAIN_CUDNN=ON \
    -DHPCTRAIN_NCCL=ON -DHPCTRAIN_TEST_FASHION_MNIST_DIR="$data" "${cmake_args[@]}" > "$results/cmake.log" 2>&1 ||
    { tail -n 30 "$results/cmake.log"; die "cmake failed (log: $results/cmake.log)"; }
  local targets=(hpctrain gpu_step kernels_test nccl_test network_test memory_test train_gpu_test loader_throughput hpcdata-pack
    allreduce_sweep)
  cmake --build "$build_dir" -j "$(nproc)" --target "${targets[@]}" > "$results/build.log" 2>&1 ||
    { tail -n 40 "$results/build.log"; die "the build failed (log: $results/build.log)"; }
  report << EOS
built=${targets[*]}
hpctrain_version=$("$hpctrain" --version | head -n 1)
EOS
}

# ctest_step NAME ARGS...: a ctest run whose verdict is the step's result.
ctest_step() {
  local name=$1 rc=0
  shift
  need_build
  (cd "$build_dir" && ctest "$@" --output-on-failure --timeout 280) | tee "$tmp/ctest.log" || rc=$?
  report << EOS
${name}_summary=$(grep -E 'tests passed|tests failed' "$tmp/ctest.log" | tail -n 1)
${name}_failed=$(grep -cE '\*\*\*Failed|\(Failed\)' "$tmp/ctest.log" || true)
${name}_skipped=$(grep -c '(Skipped)' "$tmp/ctest.log" || true)
${name}_exit=$rc
EOS
  return "$rc"
}

cnn_step() {
  need_build
  need_peer
  # The trainer replays its steps as a CUDA graph by default (one rank on its GPU): so does the
  # headline step; the eager steps (--no-cuda-graphs) beside it.
  echo "== 1/4 steady steps, batch on the GPU, as a CUDA graph: gpu_step --model cnn --batch $batch --precision $peer_precision --cuda-graphs"
  "$gpu_step" --model cnn --batch "$batch" --precision "$peer_precision" --cuda-graphs | tee "$tmp/ours.json"
  echo "== 1b/4 the same steps launched one by one (the trainer's --no-cuda-graphs): gpu_step ..."
  "$gpu_step" --model cnn --batch "$batch" --precision "$peer_precision" | tee "$tmp/ours_eager.json"
  echo "== 2/4 the same steps in PyTorch: torch_gpu_steps.py cnn"
  "$python" "$root/bench/torch_gpu_steps.py" cnn --batch "$batch" --precision "$peer_precision" | tee "$tmp/peer.json"
  local ours_steady peer_steady flops
  ours_steady=$(json_number images_per_s < "$tmp/ours.json")
  peer_steady=$(json_number images_per_s < "$tmp/peer.json")
  flops=$(json_number train_flops_per_sample < "$tmp/ours.json")
  echo "== 3/4 end to end: hpctrain --device cuda --batch-size $batch --epochs $epochs --precision $precision"
  "$hpctrain" --device cuda --batch-size "$batch" --epochs "$epochs" --precision "$precision" --data-dir "$data" \
    --metrics-file "$tmp/m.jsonl" 2>&1 | sed -u 's/^/  /'
  local done_line
  done_line=$(grep '"event":"done"' "$tmp/m.jsonl" | tail -n 1)
  [[ -n "$done_line" ]] || die "hpctrain wrote no done line"
  # The default replays each step as one CUDA graph; the same run with every kernel launched
  # from the host beside it, which must end with the same bits.
  echo "== 3b/4 the same with --no-cuda-graphs"
  "$hpctrain" --device cuda --batch-size "$batch" --epochs "$epochs" --precision "$precision" --data-dir "$data" \
    --no-cuda-graphs --metrics-file "$tmp/e.jsonl" 2>&1 | sed -u 's/^/  /'
  local e_line
  e_line=$(grep '"event":"done"' "$tmp/e.jsonl" | tail -n 1)
  [[ -n "$e_line" ]] || die "hpctrain --no-cuda-graphs wrote no done line"
  echo "== 4/4 end to end: the peer, $peer cnn --batch $batch --epochs $epochs --precision $peer_precision"
  PYTHONUNBUFFERED=1 "$python" "$peer" cnn --data-dir "$data" --batch "$batch" --epochs "$epochs" \
    --precision "$peer_precision" 2>&1 | tee "$tmp/peer.log" | sed -u 's/^/  /'
  local peer_line
  peer_line=$(json_line images_per_s "$tmp/peer.log")
  [[ -n "$peer_line" ]] || die "the peer printed no result line"
  local ours_e2e peer_e2e
  ours_e2e=$(json_number images_per_second <<< "$done_line")
  peer_e2e=$(json_number images_per_s <<< "$peer_line")
  local eager_steady eager_e2e
  eager_steady=$(json_number images_per_s < "$tmp/ours_eager.json")
  eager_e2e=$(json_number images_per_second <<< "$e_line")
  report << EOS
cnn_precision=$precision
cnn_batch=$batch
cnn_steady_hpctrain_images_per_second=$ours_steady
cnn_steady_peer_images_per_second=$peer_steady
cnn_steady_ratio_hpctrain_over_peer=$(calc "$ours_steady / $peer_steady" 2)
cnn_steady_hpctrain_cuda_graphs_images_per_second=$ours_steady
cnn_steady_cuda_graphs_ratio_over_peer=$(calc "$ours_steady / $peer_steady" 2)
cnn_steady_hpctrain_eager_images_per_second=$eager_steady
cnn_steady_eager_ratio_over_peer=$(calc "$eager_steady / $peer_steady" 2)
cnn_steady_hpctrain_mfu=$(mfu "$ours_steady" "$flops" "$peer_precision")
cnn_steady_peer_mfu=$(mfu "$peer_steady" "$flops" "$peer_precision")
cnn_e2e_epochs=$epochs
cnn_e2e_hpctrain_images_per_second=$ours_e2e
cnn_e2e_hpctrain_test_accuracy=$(json_number test_accuracy <<< "$done_line")
cnn_e2e_peer_images_per_second=$peer_e2e
cnn_e2e_peer_test_accuracy=$(json_number test_acc <<< "$peer_line")
cnn_e2e_ratio_hpctrain_over_peer=$(calc "$ours_e2e / $peer_e2e" 2)
cnn_e2e_hpctrain_cuda_graphs_images_per_second=$ours_e2e
cnn_e2e_hpctrain_eager_images_per_second=$eager_e2e
cnn_e2e_eager_ratio_over_peer=$(calc "$eager_e2e / $peer_e2e" 2)
cnn_e2e_hpctrain_cuda_graphs_same_checksum=$([[ $(checksum <<< "$e_line") == $(checksum <<< "$done_line") ]] && echo yes || echo no)
cnn_ratio_target=3.0
EOS
}

resnet50_step() {
  need_build
  need_peer
  # The step replayed as one CUDA graph, as the trainer replays it by default: the GPU's time
  # without the host's 600-odd launches a step; the eager steps (--no-cuda-graphs) beside it.
  echo "== 1/4 steady steps as a CUDA graph: gpu_step --model resnet50 --image-size 224 --channels 3 --classes 1000 --precision bf16 --cuda-graphs"
  "$gpu_step" --model resnet50 --image-size 224 --channels 3 --classes 1000 --precision bf16 --batch "$r50_batch" \
    --no-deterministic --cuda-graphs | tee "$tmp/ours.json"
  local ours flops lines eager
  ours=$(json_number images_per_s < "$tmp/ours.json")
  flops=$(json_number train_flops_per_sample < "$tmp/ours.json")
  echo "== 1b/4 the same steps launched one by one (the trainer's --no-cuda-graphs): gpu_step ..."
  "$gpu_step" --model resnet50 --image-size 224 --channels 3 --classes 1000 --precision bf16 --batch "$r50_batch" \
    --no-deterministic | tee "$tmp/eager.json"
  eager=$(json_number images_per_s < "$tmp/eager.json")
  lines="resnet50_batch=$r50_batch
resnet50_train_flops_per_sample=$flops
resnet50_steady_hpctrain_images_per_second=$ours
resnet50_steady_hpctrain_mfu=$(mfu "$ours" "$flops" bf16)
resnet50_steady_hpctrain_cuda_graphs_images_per_second=$ours
resnet50_steady_hpctrain_cuda_graphs_mfu=$(mfu "$ours" "$flops" bf16)
resnet50_steady_hpctrain_eager_images_per_second=$eager
resnet50_steady_hpctrain_eager_mfu=$(mfu "$eager" "$flops" bf16)"
  # With another batch-norm launch (HPCTRAIN_BN_TUNING, as `all --bn-tuning` sets it), the
  # default's steady step beside it.
  if [[ -n ${HPCTRAIN_BN_TUNING:-} ]]; then
    echo "== 1c/4 the steady steps with the default batch-norm launch (this run: $HPCTRAIN_BN_TUNING)"
    env -u HPCTRAIN_BN_TUNING "$gpu_step" --model resnet50 --image-size 224 --channels 3 --classes 1000 \
      --precision bf16 --batch "$r50_batch" --no-deterministic --cuda-graphs | tee "$tmp/default_bn.json"
    lines+="
resnet50_bn_tuning=$HPCTRAIN_BN_TUNING
resnet50_steady_hpctrain_default_bn_images_per_second=$(json_number images_per_s < "$tmp/default_bn.json")"
  fi
  local modes=(eager) mode flag theirs
  ((compile)) && modes+=(compile)
  for mode in "${modes[@]}"; do
    flag=()
    [[ $mode == compile ]] && flag=(--compile)
    echo "== 2/4 the same steps in PyTorch ($mode): torch_gpu_steps.py resnet50 --channels-last ${flag[*]}"
    "$python" "$root/bench/torch_gpu_steps.py" resnet50 --batch "$r50_batch" --precision bf16 --channels-last \
      "${flag[@]}" | tee "$tmp/peer.json"
    theirs=$(json_number images_per_s < "$tmp/peer.json")
    lines+="
resnet50_steady_peer_${mode}_images_per_second=$theirs
resnet50_steady_peer_${mode}_mfu=$(mfu "$theirs" "$flops" bf16)
resnet50_steady_ratio_over_peer_${mode}=$(calc "$ours / $theirs" 2)
resnet50_steady_cuda_graphs_ratio_over_peer_${mode}=$(calc "$ours / $theirs" 2)
resnet50_steady_eager_ratio_over_peer_${mode}=$(calc "$eager / $theirs" 2)"
  done
  # End to end: 4 epochs of 2048 synthetic images through the trainer; the last epoch's rate
  # (cuDNN's algorithm choice and the allocator's first requests fall in the first).
  echo "== 3/4 end to end: hpctrain --model resnet50 --dataset synthetic --image-size 224 --precision bf16"
  "$hpctrain" --device cuda --model resnet50 --dataset synthetic --image-size 224 --precision bf16 \
    --no-deterministic --batch-size "$r50_batch" --epochs 4 --test-samples "$r50_batch" \
    --metrics-file "$tmp/r50.jsonl" 2>&1 | sed -u 's/^/  /'
  local epoch_line
  epoch_line=$(grep '"event":"epoch"' "$tmp/r50.jsonl" | tail -n 1)
  [[ -n "$epoch_line" ]] || die "hpctrain's resnet50 run wrote no epoch line"
  local e2e
  e2e=$(json_number images_per_second <<< "$epoch_line")
  echo "== 3b/4 the same with --no-cuda-graphs"
  "$hpctrain" --device cuda --model resnet50 --dataset synthetic --image-size 224 --precision bf16 \
    --no-deterministic --batch-size "$r50_batch" --epochs 4 --test-samples "$r50_batch" --no-cuda-graphs \
    --metrics-file "$tmp/r50e.jsonl" 2>&1 | sed -u 's/^/  /'
  epoch_line=$(grep '"event":"epoch"' "$tmp/r50e.jsonl" | tail -n 1) || true
  [[ -n "$epoch_line" ]] || die "hpctrain's resnet50 run with --no-cuda-graphs wrote no epoch line"
  report << EOS
$lines
resnet50_e2e_hpctrain_images_per_second=$e2e
resnet50_e2e_hpctrain_cuda_graphs_images_per_second=$e2e
resnet50_e2e_hpctrain_eager_images_per_second=$(json_number images_per_second <<< "$epoch_line")
resnet50_e2e_hpctrain_mfu=$(mfu "$e2e" "$flops" bf16)
resnet50_ratio_target=1.0
EOS
  # Then on JPEG shards; its lines added to the step's (a failure there keeps those above).
  local jpeg
  jpeg=$(resnet50_jpeg_e2e)
  cat << EOS | tee -a "$results/$step.txt"
resnet50_jpeg_e2e_images_per_second=$jpeg
resnet50_jpeg_e2e_ratio_over_synthetic=$(calc "$jpeg / $e2e" 2)
resnet50_jpeg_e2e_data_wait_share=$(cat "$tmp/jpeg_wait")
resnet50_jpeg_e2e_ratio_target=0.9
EOS
}

# The same end to end on real JPEGs (about 40 s): 4096 photograph-sized ones (375x500, noise over
# gradients, about 100 KB each) made here by loader_throughput's generator, packed by `hpcdata
# pack`, decoded on the GPU (--jpeg-decode gpu: nvJPEG, then the crop kernel) while the steps run.
# Prints the last of 3 epochs' images/s (the first pays for cuDNN's choices).
resnet50_jpeg_e2e() {
  local gen=$build_dir/bench/loader_throughput pack=$build_dir/datasets/hpcdata-pack jpegs=$tmp/jpegs split
  [[ -x $gen && -x $pack ]] ||
    die "no loader_throughput or hpcdata-pack in $build_dir (run: bench/gpu_vs_peer.sh build)"
  echo "== 4/4 end to end on JPEG shards: loader_throughput --make-jpegs, hpcdata pack, hpctrain --jpeg-decode gpu" >&2
  "$gen" --make-jpegs "$jpegs/src" --images 4096 --source 375x500 >&2 || die "loader_throughput --make-jpegs failed"
  for split in train val; do
    HPCDATA_PACK=$pack "$root/datasets/hpcdata" pack "$jpegs/src" "$jpegs/packed" --split "$split" >&2 ||
      die "hpcdata pack --split $split failed"
  done
  # (A command substitution does not inherit set -e: each failure is checked.)
  "$hpctrain" --device cuda --model resnet50 --dataset shards --data-dir "$jpegs/packed" --image-size 224 \
    --precision bf16 --no-deterministic --jpeg-decode gpu --batch-size "$r50_batch" --epochs 3 \
    --test-samples "$r50_batch" --metrics-file "$tmp/r50_jpeg.jsonl" --metrics-every-steps 1 2>&1 |
    sed -u 's/^/  /' >&2 || die "hpctrain's resnet50 run on JPEG shards failed"
  local epoch_line
  epoch_line=$(grep '"event":"epoch"' "$tmp/r50_jpeg.jsonl" | tail -n 1) || true
  [[ -n "$epoch_line" ]] || die "hpctrain's resnet50 run on JPEG shards wrote no epoch line"
  # Whether the loader (its nvJPEG decode) or the step bounds the rate: the last epoch's steps'
  # wait for their batch, as a share of their time (resnet50_jpeg_e2e_data_wait_share).
  jpeg_wait_share "$tmp/r50_jpeg.jsonl" > "$tmp/jpeg_wait" || echo unknown > "$tmp/jpeg_wait"
  json_number images_per_second <<< "$epoch_line"
}

# jpeg_wait_share METRICS: the last whole epoch's step events' data_wait_seconds over their
# step_seconds, 3 decimals (an epoch's step events come before its epoch event).
jpeg_wait_share() {
  awk '/"event":"epoch"/ { last_wait = wait; last_total = total; wait = 0; total = 0; next }
       /"event":"step"/ {
         w = $0; sub(/.*"data_wait_seconds": ?/, "", w); sub(/[,}].*/, "", w)
         t = $0; sub(/.*"step_seconds": ?/, "", t); sub(/[,}].*/, "", t)
         wait += w; total += t }
       END { if (last_total > 0) printf "%.3f\n", last_wait / last_total; else exit 1 }' "$1"
}

# kernels: ncu's duration and DRAM bytes of every kernel launch in two gpu_step steps
# (deterministic, so cuDNN times no candidate algorithms: the two steps launch the same kernels),
# the second step's launches grouped by kernel name (bench/ncu_kernels.py), against the copy
# bandwidth gpu_step measures first. ncu replays each launch (caches flushed before each replay:
# the bytes are those of a cold L2), so the step itself runs slowly.
# bn: gpu_step --kernel-shapes (every launch choice of the batch-norm passes on ResNet-50's
# shapes, bf16), its per-choice totals over the 53 batch norms, fastest first.
bn_step() {
  need_build
  echo "== bn: gpu_step --kernel-shapes --batch $r50_batch"
  "$gpu_step" --kernel-shapes --batch "$r50_batch" > "$tmp/shapes.jsonl" || die "gpu_step --kernel-shapes failed"
  cp "$tmp/shapes.jsonl" "$results/bn_shapes.jsonl"
  grep '"batch_norm_resnet50"' "$tmp/shapes.jsonl"
  local best default default_ms best_ms relu_ms
  best=$(grep '"batch_norm_resnet50"' "$tmp/shapes.jsonl" | head -n 1 | sed 's/.*"tuning": "\([0-9,]*\)".*/\1/')
  [[ $best =~ ^[0-9]+,[0-9]+,[0-9]+,[01](,[0-9]+(,[01])?)?$ ]] || die "gpu_step --kernel-shapes named no fastest choice"
  best_ms=$(grep '"batch_norm_resnet50"' "$tmp/shapes.jsonl" | head -n 1 | json_number batch_norms_ms)
  default=$(grep '"batch_norm_resnet50".*"default": 1' "$tmp/shapes.jsonl" | sed 's/.*"tuning": "\([0-9,]*\)".*/\1/')
  default_ms=$(grep '"batch_norm_resnet50".*"default": 1' "$tmp/shapes.jsonl" | json_number batch_norms_ms)
  relu_ms=$(grep '"batch_norm_resnet50"' "$tmp/shapes.jsonl" | head -n 1 | json_number relu_backward_ms)
  report << EOS
bn_tuning_default=$default
bn_tuning_default_resnet50_ms=$default_ms
bn_tuning_best=$best
bn_tuning_best_resnet50_ms=$best_ms
bn_tuning_relu_backward_resnet50_ms=$relu_ms
EOS
}

kernels_step() {
  need_build
  local ncu copy
  ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -n 1) || true
  [[ -n $ncu ]] || die "no Nsight Compute here (ncu not on PATH, in /usr/local/cuda/bin or /opt/nvidia/nsight-compute)"
  echo "== kernels: the copy bandwidth, gpu_step --copy-bandwidth"
  "$gpu_step" --copy-bandwidth | tee "$tmp/copy.json"
  copy=$(json_number copy_bytes_per_s < "$tmp/copy.json")
  [[ -n $copy ]] || die "gpu_step --copy-bandwidth printed no copy_bytes_per_s"
  local args=(--model cnn --batch "$batch" --precision "$peer_precision")
  [[ $kernels_model == resnet50 ]] &&
    args=(--model resnet50 --image-size 224 --channels 3 --classes 1000 --precision bf16 --batch "$r50_batch")
  echo "== kernels: $ncu on gpu_step ${args[*]} --warmup 1 --iters 1"
  "$ncu" --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
    --csv --print-units base --log-file "$tmp/ncu.csv" "$gpu_step" "${args[@]}" --warmup 1 --iters 1 ||
    die "ncu or gpu_step failed"
  "$python" "$root/bench/ncu_kernels.py" "$tmp/ncu.csv" "$kernels_model" "$copy" > "$tmp/kernels.txt" \
    2> "$tmp/kernels.err" ||
    die "could not read ncu's measurements: $(tail -n 1 "$tmp/kernels.err" | sed 's/^ncu_kernels.py: error: //')"
  grep '^#' "$tmp/kernels.txt"
  grep -v '^#' "$tmp/kernels.txt" | report
}

# all: the steps in order under one time limit (see the header).
# The scaling model's local check (issue 44) on this machine's cores: CPU ranks, no GPU.
scaling_step() {
  need_build
  local log=$results/scaling.log rc=0
  echo "== scaling: bench/scaling_check.sh on $(nproc) cores (log: $log)"
  BUILD_DIR=$build_dir FASHION_MNIST=$data PYTHON=$python "${SCALING_CHECK:-$root/bench/scaling_check.sh}" \
    --keep "$results/scaling" \
    > "$log" 2>&1 || rc=$?
  cat "$log"
  ((rc == 0)) || die "bench/scaling_check.sh failed (exit $rc)"
  report << EOS
scaling_cores=$(nproc)
scaling_checks_failed=$(sed -n 's/^checks_failed=//p' "$log")
scaling_checks_failed_cold_sweep=$(sed -n 's/^checks_failed_cold_sweep=//p' "$log")
$(grep '^scaling_[0-9]' "$log")
EOS
}

all_step() {
  # Whole seconds since the start, from the microsecond clock: bash's SECONDS ticks on whole
  # seconds of the wall clock, so it may read 1 a millisecond after the start.
  local out=${out_dir:-$results} start=${EPOCHREALTIME/[.,]/} st left rc failed=()
  elapsed() { echo $(((${EPOCHREALTIME/[.,]/} - start) / 1000000)); }
  mkdir -p "$out"
  rm -f "$results"/{build,tests,bn,training,cnn,resnet50,kernels,scaling}.txt
  : > "$out/all.log"
  export CTEST_PARALLEL_LEVEL=${CTEST_PARALLEL_LEVEL:-4}
  # summary.txt anew after every step: a device call cut off by its own time limit still brings
  # back the figures of the steps that ended.
  summarise() { cat "$results"/*.txt > "$out/summary.txt" 2> /dev/null || true; }
  for st in build tests bn training cnn resnet50 kernels scaling; do
    summarise
    left=$((within - $(elapsed)))
    if ((left < 30)); then
      echo "== all: $st not run (${left} s left of --within $within)" | tee -a "$out/all.log"
      failed+=("$st (not run)")
      continue
    fi
    echo "== all: $st at $(elapsed) s, under ${left} s" | tee -a "$out/all.log"
    rc=0
    timeout -k 5 "$left" "$0" "$st" "${step_args[@]}" >> "$out/all.log" 2>&1 || rc=$?
    # (set -e: the substitution must not fail, or the failed step would end `all` here.)
    ((rc == 0)) || failed+=("$st (exit $rc$( ((rc == 124)) && echo ": out of time" || true))")
    echo "== all: $st exit $rc at $(elapsed) s" | tee -a "$out/all.log"
    [[ -f $results/$st.txt ]] && grep -v '^#' "$results/$st.txt"
    [[ $st == build && $rc -ne 0 ]] && { tail -n 30 "$out/all.log"; break; }
    # The steps after bn with the batch-norm launch asked for (best: bn's fastest).
    if [[ $st == bn && -n $bn_tuning ]]; then
      local chosen=$bn_tuning
      [[ $chosen == best ]] && chosen=$(sed -n 's/^bn_tuning_best=//p' "$results/bn.txt" 2> /dev/null || true)
      if [[ -n $chosen ]]; then
        export HPCTRAIN_BN_TUNING=$chosen
        echo "== all: HPCTRAIN_BN_TUNING=$chosen for the steps after bn" | tee -a "$out/all.log"
      fi
    fi
  done
  summarise
  # The scaling step's runs (each one's Chrome trace and metrics, the sweep): a third file, small
  # enough to come back from a device call's $OUT, for taking a failed check apart afterwards.
  # Written beside it and renamed: a call stopped midway leaves no half archive under that name.
  if [[ -d $results/scaling ]]; then
    if tar -czf "$out/scaling.tar.gz.part" -C "$results" --exclude 'ckpt*' scaling 2> /dev/null; then
      mv -f "$out/scaling.tar.gz.part" "$out/scaling.tar.gz"
    else
      rm -f "$out/scaling.tar.gz.part"
      echo "== all: could not pack $results/scaling into $out/scaling.tar.gz" | tee -a "$out/all.log"
    fi
  fi
  # The verdict in all three places a reader may have: stdout, all.log and summary.txt.
  echo "all_steps_not_passed=${#failed[@]}" >> "$out/summary.txt"
  if ((${#failed[@]})); then
    echo "== all: not passed: ${failed[*]} (log: $out/all.log)" | tee -a "$out/all.log"
    return 1
  fi
  echo "== all: every step passed (log: $out/all.log)" | tee -a "$out/all.log"
}

case $step in
  all) all_step ;;
  build) build_step ;;
  tests) ctest_step gpu_tests -L gpu -E GpuTraining ;;
  bn) bn_step ;;
  training) ctest_step gpu_training -R GpuTraining ;;
  cnn) cnn_step ;;
  resnet50) resnet50_step ;;
  kernels) kernels_step ;;
  scaling) scaling_step ;;
esac

#!/usr/bin/env bash
# Short trainings that together cover every model, every option that changes what a CPU step
# computes, and the resume paths, each printed as one line: its name and the final
# param_checksum (and state_checksum, where the binary reports one). Given two binaries it runs
# each run with both and says whether their param_checksums are the same: the check that a
# refactoring changed no bit of training (issue 22).
#
#   bench/same_bits.sh HPCTRAIN                  # name  param_checksum  state_checksum
#   bench/same_bits.sh HPCTRAIN_OLD HPCTRAIN_NEW # name  old  new  same|DIFFERENT; exit 1 if any differs
#   FULL=1 bench/same_bits.sh ...                # also the default job (2 ranks, 4 epochs: minutes)
#   ONLY=regex bench/same_bits.sh ...            # only the runs whose name matches
#
# Fashion-MNIST from FASHION_MNIST (default: Debian's); CIFAR-10 and CIFAR-100 are made here
# (sparse files of the published sizes whose first records hold patterns), and so are packed
# shards (with the built hpcdata-pack, HPCDATA_PACK; skipped without it).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

for arg in "$@"; do
  case "$arg" in
    -h | --help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;;
    -*) die "unknown option '$arg' (try --help)" ;;
  esac
done
[[ $# -ge 1 && $# -le 2 ]] || die "give one hpctrain binary, or two to compare (try --help)"
for bin in "$@"; do
  [[ -f $bin && -x $bin ]] || die "no hpctrain binary at '$bin' (not an executable file)"
done
BINS=("$(realpath "$1")")
[[ $# -eq 2 ]] && BINS+=("$(realpath "$2")")
FASHION=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
REPO=$(cd "$(dirname "$0")/.." && pwd)
PACK=${HPCDATA_PACK:-$REPO/build/datasets/hpcdata-pack}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_backing_directory=/tmp
unset HPCTRAIN_TEST_SIGNAL_AFTER_STEP HPCTRAIN_TEST_KILL_AFTER_STEP HPCTRAIN_TEST_SIGNAL_IN_SETUP

WORK=$(mktemp -d /tmp/same-bits-XXXXXX)
trap 'rm -rf "$WORK"' EXIT

# ---- data ------------------------------------------------------------------------------------

# CIFAR files of the published record counts; the first 400 records of each hold a pattern of
# the file, record and pixel (the rest stay sparse zeros), so crops and flips change the input.
python3 - "$WORK" <<'EOF'
import os, sys
work = sys.argv[1]
def write(path, records, record_bytes, labels_bytes, seed, classes):
    head = bytearray()
    for r in range(400):
        label = (r * 7 + seed) % classes
        head += bytes([label % 20, label] if labels_bytes == 2 else [label])
        head += bytes(((p * 13 + r * 31 + seed * 57 + (p // 96) * r) * 7) & 0xff for p in range(3072))
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(records * record_bytes)
os.makedirs(f"{work}/cifar10"); os.makedirs(f"{work}/cifar100")
for i in range(1, 6):
    write(f"{work}/cifar10/data_batch_{i}.bin", 10000, 3073, 1, i, 10)
write(f"{work}/cifar10/test_batch.bin", 10000, 3073, 1, 9, 10)
write(f"{work}/cifar100/train.bin", 50000, 3074, 2, 3, 100)
write(f"{work}/cifar100/test.bin", 10000, 3074, 2, 4, 100)
EOF
mkdir -p "$WORK/mnist"
for f in "$FASHION"/*.gz; do ln -s "$f" "$WORK/mnist/"; done  # the same IDX files, read as MNIST

# Packed shards from grey JPEGs of flat 8x8 blocks (a DC-only baseline encoder: no image tool
# needed), whose block pattern depends on the class and the image.
python3 - "$WORK" <<'EOF'
import os, struct, sys
work = sys.argv[1]
def segment(marker, body):
    return b"\xff" + bytes([marker]) + struct.pack(">H", len(body) + 2) + body
def jpeg(blocks):  # rows of block values 0..255
    h, w = 8 * len(blocks), 8 * len(blocks[0])
    counts = [0, 1, 5, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0]  # the standard luminance DC table
    codes, code, cat = {}, 0, 0
    for length, n in enumerate(counts, 1):
        for _ in range(n):
            codes[cat] = (code, length)
            code, cat = code + 1, cat + 1
        code <<= 1
    bits, prev = [], 0
    for row in blocks:
        for v in row:
            dc = 8 * (v - 128)
            diff, prev = dc - prev, dc
            size = abs(diff).bit_length()
            c, length = codes[size]
            bits += [(c >> (length - 1 - k)) & 1 for k in range(length)]
            value = diff if diff >= 0 else diff + (1 << size) - 1
            bits += [(value >> (size - 1 - k)) & 1 for k in range(size)]
            bits.append(0)  # end of block: the AC table's one code
    bits += [1] * (-len(bits) % 8)
    data = bytearray()
    for i in range(0, len(bits), 8):
        data.append(int("".join(map(str, bits[i:i + 8])), 2))
        if data[-1] == 0xFF:
            data.append(0)
    return (b"\xff\xd8" + segment(0xDB, b"\x00" + bytes([1] * 64))
            + segment(0xC0, struct.pack(">BHHB", 8, h, w, 1) + b"\x01\x11\x00")
            + segment(0xC4, b"\x00" + bytes(counts) + bytes(range(12)))
            + segment(0xC4, b"\x10" + bytes([1] + [0] * 15) + b"\x00")
            + segment(0xDA, b"\x01\x01\x00\x00\x3f\x00") + bytes(data) + b"\xff\xd9")
for split, n in (("train", 24), ("val", 8)):
    for c in range(3):
        os.makedirs(f"{work}/jpeg-{split}/class{c}")
        for i in range(n):
            blocks = [[(40 * c + 23 * i * (x + 1) + 61 * y * (c + 1)) % 256 for x in range(5)] for y in range(4)]
            with open(f"{work}/jpeg-{split}/class{c}/{i}.jpg", "wb") as f:
                f.write(jpeg(blocks))
EOF
SHARDS=""
if [[ -x $PACK ]]; then
  for split in train val; do
    HPCDATA_PACK=$PACK python3 "$REPO/datasets/hpcdata" pack "$WORK/jpeg-$split" "$WORK/shards" --split $split \
      --images-per-shard 16 >"$WORK/pack.log" 2>&1 || { cat "$WORK/pack.log" >&2; exit 1; }
  done
  SHARDS=$WORK/shards
fi

# ---- runs ------------------------------------------------------------------------------------

FAILED=0
FM=(--data-dir "$FASHION")
SAMPLES=(--train-samples 256 --test-samples 100 --epochs 2)
SMALL=("${SAMPLES[@]}" --batch-size 32)  # 8 steps per epoch
TINY=(--train-samples 64 --test-samples 32 --batch-size 16 --max-steps 3 --eval-batch-size 16)

# hpctrain BIN RANKS ARGS...: one run (under mpirun for RANKS > 1); its exit code.
hpctrain() {
  local bin=$1 ranks=$2
  shift 2
  if [[ $ranks -eq 1 ]]; then
    "$bin" --device cpu --threads 1 --quiet "$@" >/dev/null 2>>"$WORK/stderr"
  else
    mpirun --oversubscribe --bind-to none -np "$ranks" "$bin" --device cpu --threads 1 --quiet "$@" \
      >/dev/null 2>>"$WORK/stderr"
  fi
}

# The done line's value of KEY in metrics file M ("-" when there is none).
field() {
  local v
  v=$(tail -n 1 "$2" 2>/dev/null | sed -n "s/.*\"$1\": *\"\\([0-9a-f]*\\)\".*/\\1/p")
  echo "${v:--}"
}

# Prints NAME and what each binary's run of COMMAND... (a function or hpctrain, then its
# arguments; $M is its metrics file, $CK a fresh checkpoint directory) ended with.
check() {
  local name=$1
  shift
  [[ -n ${ONLY:-} && ! $name =~ $ONLY ]] && return 0
  local sums=() states=()
  for bin in "${BINS[@]}"; do
    M=$WORK/m.jsonl CK=$WORK/ck
    rm -rf "$M" "$CK"
    : >"$WORK/stderr"
    if ! BIN=$bin "$@"; then
      echo "$name: failed with $bin:" >&2
      cat "$WORK/stderr" >&2
    fi
    sums+=("$(field param_checksum "$M")")
    states+=("$(field state_checksum "$M")")
  done
  if [[ ${#BINS[@]} -eq 1 ]]; then
    printf '%-28s %s %s\n' "$name" "${sums[0]}" "${states[0]}"
  else
    local verdict=same
    [[ ${sums[0]} == "${sums[1]}" && ${sums[0]} != - ]] || { verdict=DIFFERENT; FAILED=1; }
    printf '%-28s %s %s %s\n' "$name" "${sums[0]}" "${sums[1]}" "$verdict"
  fi
}

# train RANKS ARGS...: a run whose metrics go to $M.
train() {
  local ranks=$1
  shift
  hpctrain "$BIN" "$ranks" "$@" --metrics-file "$M"
}

# resume RANKS_BEFORE HOOK RANKS_AFTER ARGS...: a run into $CK stopped by
# HPCTRAIN_TEST_SIGNAL_AFTER_STEP=HOOK (or killed: HOOK "kill:K@R"), then continued with
# --resume auto on RANKS_AFTER ranks; $M holds the continued run's lines.
resume() {
  local before=$1 hook=$2 after=$3
  shift 3
  local code=0
  if [[ $hook == kill:* ]]; then
    # (in a subshell, which keeps the shell's "Killed" to itself)
    (HPCTRAIN_TEST_KILL_AFTER_STEP=${hook#kill:} hpctrain "$BIN" "$before" "$@" --checkpoint-dir "$CK") 2>/dev/null ||
      code=$?
    [[ $code -ne 0 ]] || { echo "the killed run ended with 0" >>"$WORK/stderr"; return 1; }
  else
    HPCTRAIN_TEST_SIGNAL_AFTER_STEP=$hook hpctrain "$BIN" "$before" "$@" --checkpoint-dir "$CK" || code=$?
    [[ $code -eq 75 ]] || { echo "the stopped run ended with $code, not 75" >>"$WORK/stderr"; return 1; }
  fi
  hpctrain "$BIN" "$after" "$@" --checkpoint-dir "$CK" --resume auto --metrics-file "$M"
}

# resume_twice: stopped after step 3 and again after 11, then finished.
resume_twice() {
  HPCTRAIN_TEST_SIGNAL_AFTER_STEP=3 hpctrain "$BIN" 1 "$@" --checkpoint-dir "$CK" || [[ $? -eq 75 ]]
  HPCTRAIN_TEST_SIGNAL_AFTER_STEP=11 hpctrain "$BIN" 1 "$@" --checkpoint-dir "$CK" || [[ $? -eq 75 ]]
  hpctrain "$BIN" 1 "$@" --checkpoint-dir "$CK" --metrics-file "$M"
}

C10=(--dataset cifar10 --data-dir "$WORK/cifar10")

# Models, with and without batch norm.
check default-recipe     train 1 "${FM[@]}" "${SMALL[@]}"
check mlp                train 1 "${FM[@]}" "${SMALL[@]}" --model mlp
check mlp-no-bn          train 1 "${FM[@]}" "${SMALL[@]}" --model mlp --no-batch-norm
check cnn-no-bn          train 1 "${FM[@]}" "${SMALL[@]}" --no-batch-norm
check resnet20           train 1 "${FM[@]}" "${TINY[@]}" --model resnet20
check resnet20-no-bn     train 1 "${FM[@]}" "${TINY[@]}" --model resnet20 --no-batch-norm --lr 0.01
check resnet18           train 1 "${FM[@]}" "${TINY[@]}" --model resnet18
check resnet50           train 1 "${FM[@]}" "${TINY[@]}" --model resnet50
check resnet50-synthetic train 1 --dataset synthetic --image-size 32 "${TINY[@]}" --model resnet50
check resnet18-no-bn-syn train 1 --dataset synthetic --image-size 32 "${TINY[@]}" --model resnet18 --no-batch-norm \
  --lr 0.01
# Schedules and the optimizer.
check constant           train 1 "${FM[@]}" "${SMALL[@]}" --lr-schedule constant --lr 0.05
check step               train 1 "${FM[@]}" "${SMALL[@]}" --lr-schedule step --lr-step-epochs 0.5,1 --lr-gamma 0.3
check cosine-warmup      train 1 "${FM[@]}" "${SMALL[@]}" --lr-schedule cosine --min-lr 0.01 --warmup-epochs 0.5
check onecycle-fixed-mom train 1 "${FM[@]}" "${SMALL[@]}" --no-cycle-momentum --momentum 0.8
check onecycle-shape     train 1 "${FM[@]}" "${SMALL[@]}" --onecycle-pct-start 0.4 --onecycle-div-factor 10 \
  --onecycle-final-div-factor 100 --onecycle-base-momentum 0.8 --onecycle-max-momentum 0.9
check no-nesterov        train 1 "${FM[@]}" "${SMALL[@]}" --no-nesterov
check no-momentum        train 1 "${FM[@]}" "${SMALL[@]}" --no-nesterov --lr-schedule constant --momentum 0
check no-decay-bias-norm train 1 "${FM[@]}" "${SMALL[@]}" --no-decay-bias-and-norm --weight-decay 1e-3
check no-weight-decay    train 1 "${FM[@]}" "${SMALL[@]}" --weight-decay 0
check no-label-smoothing train 1 "${FM[@]}" "${SMALL[@]}" --label-smoothing 0
check kaiming-normal     train 1 "${FM[@]}" "${SMALL[@]}" --init kaiming-normal
check seed-7             train 1 "${FM[@]}" "${SMALL[@]}" --seed 7
# Data: batches, augmentation, datasets.
check augment-on         train 1 "${FM[@]}" "${SMALL[@]}" --augment on
check keep-last-batch    train 1 "${FM[@]}" --train-samples 300 --test-samples 100 --batch-size 64 --epochs 2 \
  --keep-last-batch
check global-batch       train 1 "${FM[@]}" "${SAMPLES[@]}" --global-batch-size 48
check max-steps          train 1 "${FM[@]}" "${SMALL[@]}" --max-steps 11
check sync-bn            train 1 "${FM[@]}" "${SMALL[@]}" --sync-batch-norm
check mnist              train 1 --dataset mnist --data-dir "$WORK/mnist" "${SMALL[@]}" --model mlp
check cifar10-augment    train 1 "${C10[@]}" "${SMALL[@]}"
check cifar10-no-augment train 1 "${C10[@]}" "${SMALL[@]}" --augment off --model mlp
check cifar100           train 1 --dataset cifar100 --data-dir "$WORK/cifar100" "${SMALL[@]}" --model resnet20 \
  --max-steps 3
if [[ -n $SHARDS ]]; then
  check shards           train 1 --dataset shards --data-dir "$SHARDS" --image-size 24 --train-samples 72 \
    --batch-size 12 --epochs 2 --eval-batch-size 8
else
  echo "shards                       skipped (no hpcdata-pack)"
fi
# Several ranks.
check 2-ranks            train 2 "${FM[@]}" "${SMALL[@]}"
check 2-ranks-sync-bn    train 2 "${FM[@]}" "${SMALL[@]}" --sync-batch-norm
check 2-ranks-keep-last  train 2 "${FM[@]}" --train-samples 300 --test-samples 100 --batch-size 32 --epochs 2 \
  --keep-last-batch
check 2-ranks-global     train 2 "${FM[@]}" "${SAMPLES[@]}" --global-batch-size 48 --no-overlap --bucket-mb 0.01
check 2-ranks-cifar      train 2 "${C10[@]}" "${SMALL[@]}"
check 4-ranks-mlp        train 4 "${FM[@]}" "${SAMPLES[@]}" --model mlp --global-batch-size 64
# Resume: stopped by a signal, killed, at an epoch boundary, on other world sizes.
check resume-signal      resume 1 5 1 "${FM[@]}" "${SMALL[@]}"
check resume-epoch-end   resume 1 8 1 "${FM[@]}" "${SMALL[@]}"
check resume-kill        resume 1 kill:7 1 "${FM[@]}" "${SMALL[@]}" --checkpoint-every-steps 3
check resume-each-epoch  resume 1 kill:11 1 "${FM[@]}" "${SMALL[@]}" --checkpoint-each-epoch
check resume-twice       resume_twice "${FM[@]}" "${SMALL[@]}"
check resume-last-step   resume 1 16 1 "${FM[@]}" "${SMALL[@]}"
check resume-cifar       resume 1 6 1 "${C10[@]}" "${SMALL[@]}"
check resume-keep-last   resume 1 3 1 "${FM[@]}" --train-samples 300 --test-samples 100 --batch-size 64 --epochs 2 \
  --keep-last-batch
check resume-keep-last-e resume 1 5 1 "${FM[@]}" --train-samples 300 --test-samples 100 --batch-size 64 \
  --epochs 2 --keep-last-batch
check resume-2-ranks     resume 2 5@1 2 "${FM[@]}" "${SMALL[@]}"
check resume-2-to-1      resume 2 5@1 1 "${FM[@]}" "${SMALL[@]}"
check resume-1-to-2      resume 1 5 2 "${FM[@]}" "${SMALL[@]}" --sync-batch-norm
check resume-2-to-4      resume 2 6@0 4 "${FM[@]}" "${SMALL[@]}" --sync-batch-norm --model mlp
if [[ ${FULL:-0} == 1 ]]; then
  check default-job      train 2
fi
exit $FAILED

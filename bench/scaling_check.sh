#!/usr/bin/env bash
# The scaling model (bench/scaling_model.py) against what this machine measures, in one invocation:
#   1. bench/allreduce_sweep on R ranks for each R of --ranks (MPI over shared memory, 4 B to
#      4 MiB), fitted to alpha and beta per rank count: the "local" cluster's links; and again
#      with the caches cold (--cold-bytes: each all-reduce after writing twice the last-level
#      cache, as a step's compute leaves them), a second set of fits whose predictions are
#      printed beside the checks' (keys ..._cold_sweep, checks_failed_cold_sweep), not counted;
#   2. one rank (mpirun -np 1) of the default job's cnn, one thread, --steps steps, with a
#      timeline of every layer group (--bucket-mb 0.001) and its step times: the model's input;
#   3. mpirun -np R of the same job (default --bucket-mb 25) with overlap and with --no-overlap:
#      the step_seconds and comm_wait_seconds of its steps after the first 5, each a mean less its
#      longest 5% (one rank's, as the model predicts them: trimmed_step_seconds, ..._exposed_...);
#   4. the model's prediction for each, from 1 and 2 only (regrouped to 25 MB buckets as hpctrain
#      cuts them), and whether it is within 20% of the measured step time and exposed communication;
#      then each run taken apart from its Chrome trace (every rank's --timeline-file), part by part
#      beside the model's (scaling_model.py --explain): what a failed check's model misses.
# It ends with a key=value line a check (scaling_R_ranks_overlap_on|off: the figures and their
# verdicts, as the table has them; bench/gpu_vs_peer.sh scaling keeps them) and checks_failed=N.
# The last, horovod, prints the model's efficiency on 512 GPUs of Horovod's 2017 cluster for
# ResNet-101 and VGG-16 against the published 90% and 68%.
# Every rank has one math thread, on the CPU (--device cpu, also on a machine with a GPU); the
# machine may have fewer cores than ranks (oversubscribed: the local cluster's cores_per_node is
# this machine's core count, and the model stretches compute by ceil(ranks / cores)). MPI runs
# with mpi_yield_when_idle, so that a communication thread waiting in MPI gives its core to the
# math threads instead of spinning on it, and with --bind-to none.
#
# Usage: bench/scaling_check.sh [--ranks 2,3,4] [--steps 150] [--keep DIR] [--cold-bytes B (0: none)]
#   --steps: 11 to 999999 (and at most what Fashion-MNIST's 60000 images hold for the most ranks);
#   --keep DIR: its files left in DIR (made where missing); a DIR of an earlier run (the same names)
#   has that run's files removed first, so that nothing resumes or appends to them; others are left.
# Environment: BUILD_DIR (default build), HPCTRAIN, ALLREDUCE_SWEEP, FASHION_MNIST (default
#              /usr/share/datasets/fashion-mnist), MPIRUN (default mpirun), PYTHON (default python3).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ranks_list=2,3,4 steps=150 keep="" cold_bytes=""
while (($#)); do
  case "$1" in
    --cold-bytes) cold_bytes=${2:-}; shift 2 || die "--cold-bytes needs a value"
      [[ -n $cold_bytes ]] || die "--cold-bytes is empty (an unset variable?)" ;;
    --ranks) ranks_list=${2:-}; shift 2 || die "--ranks needs a value" ;;
    --steps) steps=${2:-}; shift 2 || die "--steps needs a value" ;;
    --keep) keep=${2:-}; shift 2 || die "--keep needs a value"
      # Empty, it was no --keep at all: the run's files removed at its end, without a word.
      [[ -n $keep ]] || die "--keep is an empty path (an unset variable?)" ;;
    -h | --help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) die "unknown option '$1' (try --help)" ;;
  esac
done
[[ "$ranks_list" =~ ^[2-9](,[2-9])*$ ]] || die "--ranks must be rank counts 2 to 9, comma-separated, got '$ranks_list'"
require_count --steps "$steps"
((${#steps} <= 6)) || die "--steps must be at most 999999, got $steps"
# The sweep's caches as a step leaves them: each all-reduce after writing twice the last-level
# cache (cpu0's, from sysfs; 64 MiB where it says nothing), 0 for the hot loop.
if [[ -z $cold_bytes ]]; then
  l3=$(sed -nE 's/^([0-9]+)K$/\1/p' /sys/devices/system/cpu/cpu0/cache/index3/size 2> /dev/null || true)
  cold_bytes=$((2 * ${l3:-32768} * 1024))
fi
[[ $cold_bytes =~ ^(0|[1-9][0-9]{0,10})$ ]] && ((cold_bytes <= 17179869184)) ||
  die "--cold-bytes must be a byte count of at most 17179869184 (16 GiB), got '$cold_bytes'"
((steps > 10)) || die "--steps must be more than 10 (the first 5 are left out), got $steps"

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${BUILD_DIR:-build}
[[ "$build_dir" == /* ]] || build_dir="$root/$build_dir"
hpctrain=${HPCTRAIN:-$build_dir/src/hpctrain}
sweep=${ALLREDUCE_SWEEP:-$build_dir/bench/allreduce_sweep}
data=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
python=${PYTHON:-python3}
model=("$python" "$root/bench/scaling_model.py")
[[ -x "$hpctrain" ]] || die "no hpctrain binary at $hpctrain (build it, or set BUILD_DIR or HPCTRAIN)"
[[ -x "$sweep" ]] || die "no allreduce_sweep binary at $sweep (build it, or set ALLREDUCE_SWEEP)"
[[ -f "$data/train-images-idx3-ubyte.gz" ]] || die "no Fashion-MNIST in $data (set FASHION_MNIST)"
mpirun=${MPIRUN:-mpirun}
command -v "$mpirun" > /dev/null || die "no $mpirun (apt-get install openmpi-bin, or set MPIRUN)"
command -v "$python" > /dev/null || die "no $python (set PYTHON)"
mpirun_args=(--oversubscribe --bind-to none --mca mpi_yield_when_idle 1)
[[ $(id -u) -ne 0 ]] || mpirun_args+=(--allow-run-as-root)

IFS=, read -r -a ranks <<< "$ranks_list"
cores=$(nproc)
most=$(tr , '\n' <<< "$ranks_list" | sort -n | tail -n 1)
samples=$((64 * most * (steps + 1)))  # batch 64 a rank: one epoch holds every step of the most ranks
((samples <= 60000)) ||
  die "--steps $steps on $most ranks needs $samples training images, more than Fashion-MNIST's 60000 (at most $((60000 / (64 * most) - 1)) steps)"

# Every check done: only now is an earlier run's --keep cleared.
if [[ -n "$keep" ]]; then
  [[ -d "$keep" || ! -e "$keep" ]] || die "--keep $keep is not a directory"
  mkdir -p -- "$keep" 2> /dev/null && [[ -w "$keep" ]] || die "cannot create or write --keep directory $keep"
  tmp=$keep
  # What an earlier run left here (the names below): its checkpoints would resume, its files grow.
  (shopt -s nullglob
   cd "$keep" && rm -rf -- t1.jsonl m1.jsonl ckpt1 m[2-9]_o{n,ff}.jsonl trace[2-9]_o{n,ff}.json ckpt[2-9]_o{n,ff} \
     sweep{,_cold}.jsonl sweep{,_cold}_fits.json sweep{,_cold}_clusters.json sweep{,_cold}_p[2-9]_o{n,ff}.json) ||
    die "cannot clear the last run's files from --keep directory $keep"
else
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
fi
# No snapshots or checkpoints: their copies run on background threads of some ranks, and on a
# machine whose cores the ranks fill they slow those ranks (the model has no such term; with
# snapshots on, 2 ranks' backward passes ended 0.8 ms apart, median, and rank 0's wait took it).
# Each run has a checkpoint folder of its own: one it shared would resume the last run's state.
job=(--device cpu --threads 1 --data-dir "$data" --train-samples "$samples" --test-samples 100 --epochs 1 --max-steps "$steps"
     --metrics-every-steps 1 --quiet --snapshot-every-steps 0 --checkpoint-every-steps 0)
echo "scaling_check: $cores core(s), ranks ${ranks[*]}, $steps steps, cpu: $(cpu_model)"
echo "mpirun ${mpirun_args[*]}; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
# Other jobs' threads take cores the model counts as this job's: say so where they do.
load=$(cut -d' ' -f1 /proc/loadavg)
awk "BEGIN { exit !($load > $cores / 2) }" &&
  echo "warning: load average $load on $cores core(s): other jobs share the cores; steps run slower than predicted"

echo
# fit_sweep NAME [SWEEP ARGS]: the sweep on each rank count into NAME.jsonl, its fits, and the local
# preset with them and this machine's core count (NAME_clusters.json); the fits printed.
fit_sweep() {
  local name=$1 r
  shift
  for r in "${ranks[@]}"; do
    "$mpirun" "${mpirun_args[@]}" -np "$r" "$sweep" --max-bytes 4194304 "$@" >> "$tmp/$name.jsonl"
  done
  "${model[@]}" --fit-sweep "$tmp/$name.jsonl" > "$tmp/${name}_fits.json"
  # This machine is one node: as many "GPUs" a node as the most ranks asked for.
  "$python" - "$root/bench/clusters.json" "$tmp/${name}_fits.json" "$cores" "$most" > "$tmp/${name}_clusters.json" << 'EOF'
import json, sys
clusters = json.load(open(sys.argv[1]))
clusters["local"]["fits"] = json.load(open(sys.argv[2]))["fits"]
clusters["local"]["cores_per_node"] = int(sys.argv[3])
clusters["local"]["gpus_per_node"] = max(int(clusters["local"]["gpus_per_node"]), int(sys.argv[4]))
print(json.dumps(clusters, indent=1))
EOF
  "$python" - "$tmp/${name}_fits.json" << 'EOF'
import json, sys
for n, f in json.load(open(sys.argv[1]))["fits"].items():
    print(f"  {n} ranks: alpha {f['latency_us']:.2f} us, bandwidth {f['bandwidth_GBps']:.3f} GB/s "
          f"(worst point off the fit by {100 * f['worst_relative_error']:.0f}%)")
EOF
}
echo "== 1/4 all-reduce sweep: $mpirun -np R $sweep --max-bytes 4194304"
fit_sweep sweep
# The same with the caches as a step leaves them (the trainer's all-reduces follow its compute; the
# sweep's loop keeps its buffers hot): a second prediction beside the first, not a check.
if ((cold_bytes > 0)); then
  echo "   and with --cold-bytes $cold_bytes (each all-reduce after writing that much)"
  fit_sweep sweep_cold --cold-bytes "$cold_bytes"
fi

# measure FILE: the step_seconds and comm_wait_seconds of the step events after the first 5, each
# its mean less its longest 5% (scaling_model.trimmed_mean: the same statistic the model predicts;
# a median would sit on an edge: of 2 ranks each is the slowest, and waits for nobody, every other step).
measure() {
  "$python" -c '
import json, sys
sys.path.insert(0, sys.argv[2])
from scaling_model import trimmed_mean
steps = [e for e in map(json.loads, open(sys.argv[1])) if e.get("event") == "step"][5:]
print(trimmed_mean(e["step_seconds"] for e in steps), trimmed_mean(e["comm_wait_seconds"] for e in steps))' "$1" "$root/bench"
}

echo
echo "== 2/4 one rank: $mpirun -np 1 hpctrain ${job[*]} --bucket-mb 0.001 --timeline-file t1.jsonl"
"$mpirun" "${mpirun_args[@]}" -np 1 "$hpctrain" "${job[@]}" --bucket-mb 0.001 --timeline-file "$tmp/t1.jsonl" \
  --metrics-file "$tmp/m1.jsonl" --checkpoint-dir "$tmp/ckpt1"
measured=$(measure "$tmp/m1.jsonl")
read -r step1 wait1 <<< "$measured"
echo "  step $(calc "$step1 * 1000" 3) ms (trimmed mean), comm wait $(calc "$wait1 * 1000" 3) ms"

echo
echo "== 3/4 and 4/4: $mpirun -np R hpctrain ${job[*]} [--no-overlap], against the model"
printf '  %-5s %-8s %12s %12s %7s %14s %14s %7s\n' ranks overlap "step ms" "predicted" within "exposed ms" predicted within
# against NAME R MODE STEP WAIT: the model's prediction with NAME's fits, and whether it is within
# 20% of the measured step time and exposed communication; sets row (the table's), key (a key=value
# line's value) and ok (yes when both are).
against() {
  local name=$1 r=$2 mode=$3 step=$4 wait=$5 flag=() pstep pwait ok_step ok_wait
  [[ $mode == on ]] || flag=(--no-overlap)
  "${model[@]}" --timeline "$tmp/t1.jsonl" --metrics "$tmp/m1.jsonl" --clusters "$tmp/${name}_clusters.json" \
    --cluster local --gpus "$r" --bucket-mb 25 "${flag[@]}" --json > "$tmp/${name}_p${r}_$mode.json"
  local predicted  # assigned first: a failure inside $(...) then stops the script (set -e)
  predicted=$("$python" -c '
import json, sys
r = json.load(open(sys.argv[1]))["rows"][0]  # one rank'"'"'s trimmed means, as measured
print(r["trimmed_step_seconds"], r["trimmed_exposed_seconds"])' "$tmp/${name}_p${r}_$mode.json")
  read -r pstep pwait <<< "$predicted"
  ok_step=$(awk "BEGIN { print (($pstep - $step)^2 <= (0.2 * $step)^2) ? \"yes\" : \"no\" }")
  ok_wait=$(awk "BEGIN { print (($pwait - $wait)^2 <= (0.2 * $wait)^2) ? \"yes\" : \"no\" }")
  ok=no && [[ $ok_step == yes && $ok_wait == yes ]] && ok=yes
  row=$(printf '  %-5s %-8s %12.3f %12.3f %7s %14.3f %14.3f %7s' "$r" "$mode" "$(calc "$step * 1000" 3)" \
    "$(calc "$pstep * 1000" 3)" "$ok_step" "$(calc "$wait * 1000" 3)" "$(calc "$pwait * 1000" 3)" "$ok_wait")
  key=$(printf 'step %.3f ms predicted %.3f (%s), exposed %.3f ms predicted %.3f (%s)' "$(calc "$step * 1000" 3)" \
    "$(calc "$pstep * 1000" 3)" "$ok_step" "$(calc "$wait * 1000" 3)" "$(calc "$pwait * 1000" 3)" "$ok_wait")
}

failed=0 failed_cold=0 keys="" cold_rows="" cold_keys=""
for r in "${ranks[@]}"; do
  for mode in on off; do
    flag=() && [[ $mode == on ]] || flag=(--no-overlap)
    "$mpirun" "${mpirun_args[@]}" -np "$r" "$hpctrain" "${job[@]}" "${flag[@]}" --metrics-file "$tmp/m${r}_$mode.jsonl" \
      --timeline-file "$tmp/trace${r}_$mode.json" --checkpoint-dir "$tmp/ckpt${r}_$mode" 2> >(grep -v "share cores" >&2)
    measured=$(measure "$tmp/m${r}_$mode.jsonl")
    read -r step wait <<< "$measured"
    against sweep "$r" "$mode" "$step" "$wait"
    [[ $ok == yes ]] || failed=$((failed + 1))
    echo "$row"
    keys+="scaling_${r}_ranks_overlap_$mode=$key"$'\n'
    if ((cold_bytes > 0)); then
      against sweep_cold "$r" "$mode" "$step" "$wait"
      [[ $ok == yes ]] || failed_cold=$((failed_cold + 1))
      cold_rows+="$row"$'\n'
      cold_keys+="scaling_${r}_ranks_overlap_${mode}_cold_sweep=$key"$'\n'
    fi
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
if ((cold_bytes > 0)); then
  echo
  echo "   the same runs against the model with the cold sweep's fits (not counted as checks):"
  printf '%s' "$cold_rows"
fi

# What each run's time went to, rank by rank, beside the model's parts: where a check fails, which
# part the model misses (scaling_model.py --explain, from the run's Chrome trace).
for r in "${ranks[@]}"; do
  for mode in on off; do
    flag=() && [[ $mode == on ]] || flag=(--no-overlap)
    echo
    "${model[@]}" --explain "$tmp/trace${r}_$mode.json" --timeline "$tmp/t1.jsonl" --metrics "$tmp/m1.jsonl" \
      --clusters "$tmp/sweep_clusters.json" --cluster local --bucket-mb 25 "${flag[@]}" | sed 's/^/  /'
  done
done

echo
echo "== horovod: 512 P100s (128 x 4, 25 Gb/s RoCE), batch 64 a GPU, 64 MB fusion buffer, 5 ms cycle, flat ring"
for spec in resnet101:129:90 vgg16:154:68; do  # P100 img/s: bench/README.md says where from
  IFS=: read -r arch ips published <<< "$spec"
  eff=$("${model[@]}" --arch "$arch" --step-seconds "$(calc "64 / $ips" 6)" --batch 64 --cluster horovod-2017 \
    --gpus 512 --bucket-mb 64 --cycle-ms 5 --other-framework --json | "$python" -c '
import json, sys
print(100 * next(r for r in json.load(sys.stdin)["rows"] if r["scheme"] == "flat")["efficiency"])')
  off=$(awk "BEGIN { d = $eff - $published; print (d < 0 ? -d : d) <= 5 ? \"yes\" : \"no\" }")
  [[ $off == yes ]] || failed=$((failed + 1))
  echo "  $arch at $ips img/s on one P100: model $(calc "$eff" 1)%, published $published%, within 5 points: $off"
done
echo
printf '%s' "$keys$cold_keys"
((cold_bytes == 0)) || echo "checks_failed_cold_sweep=$failed_cold"
echo "checks_failed=$failed"

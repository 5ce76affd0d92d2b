# Helpers shared by the bench/*.sh scripts (sourced, not run).

# die MESSAGE: one error line naming the script, exit code 2.
die() { echo "$(basename "$0"): error: $*" >&2; exit 2; }

# json_number KEY < line: one numeric field of a flat JSON object (the last one on the input).
json_number() { sed -nE "s/.*\"$1\": ?(-?[0-9.eE+-]+).*/\\1/p" | tail -n 1; }

# calc EXPR [DECIMALS]: awk arithmetic, printed with DECIMALS (default 1) decimals.
calc() { awk "BEGIN { printf \"%.${2:-1}f\", $1 }"; }

# The peer's Python: PYTHON, default Debian's /usr/bin/python3 (where python3-torch lives).
require_torch() {
  [[ -x "$python" ]] || die "no $python (set PYTHON)"
  "$python" -c 'import torch' 2> /dev/null || die "$python cannot import torch (run ./setup.sh --bench)"
}

# Positive integer check for an option's value: require_count NAME VALUE. At most 18 digits: bash's
# arithmetic wraps past 2^63 without a word (--seeds 18446744073709551617 ran once).
require_count() {
  [[ "$2" =~ ^[1-9][0-9]*$ ]] || die "$1 must be a positive integer, got '$2'"
  ((${#2} <= 18)) || die "$1 must be a positive integer of at most 18 digits, got '$2'"
}

# build_paths: root (the repository) and build (BUILD_DIR, default build, under root unless
# absolute); then exports HPCTRAIN (default build's hpctrain) and HPCRUN (build's hpcrun).
build_paths() {
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  build=${BUILD_DIR:-build}
  [[ "$build" == /* ]] || build="$root/$build"
  export HPCRUN=${HPCRUN:-$build/launch/hpcrun} HPCTRAIN=${HPCTRAIN:-$build/src/hpctrain}
}

# Sets root, hpctrain, peer, python from the environment (see the scripts' headers).
locate_programs() {
  root=$(cd "$(dirname "${BASH_SOURCE[1]}")/.." && pwd)
  local build_dir=${BUILD_DIR:-build}
  [[ "$build_dir" == /* ]] || build_dir="$root/$build_dir"
  hpctrain=${HPCTRAIN:-$build_dir/src/hpctrain}
  gemm_shapes=${GEMM_SHAPES:-$build_dir/bench/gemm_shapes}
  peer=${PEER:-$root/../shared/bench/torch_peer.py}
  python=${PYTHON:-/usr/bin/python3}
  [[ -x "$hpctrain" ]] || die "no hpctrain binary at $hpctrain (run ./setup.sh, or set BUILD_DIR or HPCTRAIN)"
  [[ -f "$peer" ]] || die "no peer script at $peer (set PEER to shared/bench/torch_peer.py)"
  peer=$(cd "$(dirname "$peer")" && pwd)/$(basename "$peer")
  require_torch
}

# cpu_model: the CPU's model name (/proc/cpuinfo's, else lscpu's, as on Arm), or "unknown CPU".
cpu_model() {
  local m
  m=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
  [[ -n "$m" ]] || m=$(lscpu 2> /dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1)
  echo "${m:-unknown CPU}"
}

# cpu_isa: the widest x86 vector ISA the CPU offers: avx512f, avx2 or other (the kernels
# oneDNN and our own loops can use differ between these, and so does the speed).
cpu_isa() {
  grep -o -w -m1 'avx512f' /proc/cpuinfo || grep -o -w -m1 'avx2' /proc/cpuinfo || echo other
}

# conv_kernels_of < oneDNN verbose log: one line per convolution ("  ic1oc32 28x28 k3:
# forward_training brgconv:avx512_core, ..."), the directions in the order they ran, then a
# last line with the distinct implementation names (empty when none ran). The batch size is
# left out of the layer's name: evaluation runs the same layers at another one.
conv_kernels_of() {
  awk -F, '
    /_verbose,/ {
      for (i = 1; i <= NF && $i != "exec"; i++) {}
      if (i > NF || $(i + 2) != "convolution") next
      impl = $(i + 3); dir = $(i + 4); p = ""
      for (j = i + 5; j <= NF; j++) if ($j ~ /^g?[0-9]*mb[0-9]+_/) p = $j
      sub(/^g?[0-9]*mb[0-9]+_/, "", p)
      layer = p; sub(/_.*/, "", layer)
      if (match(p, /ih[0-9]+/)) layer = layer " " substr(p, RSTART + 2, RLENGTH - 2)
      if (match(p, /iw[0-9]+/)) layer = layer "x" substr(p, RSTART + 2, RLENGTH - 2)
      if (match(p, /kh[0-9]+/)) layer = layer " k" substr(p, RSTART + 2, RLENGTH - 2)
      if (!(layer in seen)) { seen[layer] = 1; order[++layers] = layer }
      if (!((layer, dir) in done)) { done[layer, dir] = 1; ran[layer] = ran[layer] (ran[layer] == "" ? "" : ", ") dir " " impl }
      if (!(impl in named)) { named[impl] = 1; impls = impls (impls == "" ? "" : " ") impl }
    }
    END {
      for (l = 1; l <= layers; l++) print "  " order[l] ": " ran[order[l]]
      print impls
    }'
}

# print_conv_kernels THREADS: runs one training step of the default job with oneDNN's verbose
# output on and prints, per convolution, which oneDNN implementation ran in each direction
# (a layer or direction not listed runs hpctrain's own convolution: Winograd F(2x2, 3x3) for
# the 3x3 stride-1 layers it fits, as cnn's conv2; the narrow direct kernel for the weight
# gradient of layers with at most 32 inputs per output, as cnn's conv1; else im2col + GEMM,
# for a build without oneDNN or a shape oneDNN has only reference kernels for; the first
# layer computes no input gradient).
# Sets conv_kernels (the distinct implementation names, space-separated, or "none") and
# onednn_isa (the ISA oneDNN says it dispatches for, or "not reported").
print_conv_kernels() {
  local log found
  log=$(mktemp)
  if ! ONEDNN_VERBOSE=1 DNNL_VERBOSE=1 "$hpctrain" --threads "$1" --max-steps 1 --quiet > "$log" 2>&1; then
    found=$(grep -v '_verbose,' "$log" | tail -n 1)
    rm -f "$log"
    die "the one-step run that shows oneDNN's kernels failed: ${found:-no message}"
  fi
  onednn_isa=$(sed -n 's/^[a-z]*_verbose,.*,isa:\([^,]*\).*/\1/p' "$log" | head -n 1)
  onednn_isa=${onednn_isa:-not reported}
  found=$(conv_kernels_of < "$log")
  rm -f "$log"
  conv_kernels=$(tail -n 1 <<< "$found")
  conv_kernels=${conv_kernels:-none}
  echo "oneDNN convolution kernels (one training step, ONEDNN_VERBOSE=1; oneDNN ISA: $onednn_isa):"
  if [[ "$conv_kernels" == none ]]; then
    echo "  none ran: hpctrain's own convolutions throughout"
  else
    sed '$d' <<< "$found"
  fi
  echo "  (not listed: hpctrain's own Winograd F(2x2, 3x3) where it fits, its narrow kernel for the weight gradient of layers with at most 32 inputs per output, else im2col + GEMM)"
}

# require_smoothing VALUE: a label smoothing in [0, 1), written as a plain decimal (0.1).
require_smoothing() {
  [[ "$1" =~ ^(0|0?\.[0-9]+|0\.[0-9]*)$ ]] || die "--label-smoothing must be a number in [0, 1) such as 0.1, got '$1'"
}

# The label smoothing of hpctrain's default job (--label-smoothing's default); the benches pass
# theirs to both sides always, since the peer's own default is none.
default_smoothing=0.1

# smoothing_flag VALUE: sets smoothing_args to the flag both sides take, 0 included.
smoothing_flag() { smoothing_args=(--label-smoothing "$1"); }

# mean VALUE...: their mean with 5 decimals; a single value is returned as written.
mean() {
  (($# > 1)) || { echo "$1"; return; }
  printf '%s\n' "$@" | awk '{ s += $1 } END { printf "%.5f\n", s / NR }'
}

# sample_sd VALUE...: their sample standard deviation (n - 1 in the denominator) with 5
# decimals; "n/a" for a single value.
sample_sd() {
  (($# > 1)) || { echo n/a; return; }
  printf '%s\n' "$@" | awk '{ x[NR] = $1; s += $1 }
    END { m = s / NR; for (i = 1; i <= NR; i++) q += (x[i] - m) ^ 2; printf "%.5f\n", sqrt(q / (NR - 1)) }'
}

# train_flops DONE_LINE LOG: sets flops (training FLOPs per image, forward + backward) and
# flops_source: from hpctrain's metrics (train_flops_per_sample) when it reports them, else
# from its log ("<x> MFLOP train(ing) per sample/image"), else the cnn figure (8.48 MFLOP
# forward: convs 0.45 + 7.23, fc 0.80; backward twice that but for conv1, which needs no
# input gradient: 16.5; together 25.0 MFLOP).
train_flops() {
  local mflop
  flops=$(json_number train_flops_per_sample <<< "$1")
  flops_source="hpctrain metrics (train_flops_per_sample)"
  [[ -z "$flops" ]] || return 0
  mflop=$(sed -nE 's/.*[^0-9.]([0-9]+(\.[0-9]+)?) MFLOP (forward ?\+ ?backward|train|training)[^,;]* per (sample|image).*/\1/p' \
    "$2" | head -n 1)
  if [[ -n "$mflop" ]]; then
    flops=$(calc "$mflop * 1e6" 0)
    flops_source="hpctrain log ($mflop MFLOP per image)"
  else
    flops=25.0e6
    flops_source="fallback: the cnn constant 25.0 MFLOP/image (hpctrain logs no training FLOPs)"
  fi
}

# sgemm_peak THREADS: sets peak, this machine's sgemm GFLOP/s with THREADS threads
# (bench/gemm_shapes --peak-only), or dies with one line.
sgemm_peak() {
  [[ -x "$gemm_shapes" ]] || die "no gemm_shapes binary at $gemm_shapes (run ./setup.sh, or set GEMM_SHAPES)"
  local out
  out=$("$gemm_shapes" --peak-only --threads "$1" 2>&1) ||
    die "$gemm_shapes --peak-only --threads $1 failed: $(tail -n 1 <<< "$out")"
  peak=$(sed -n 's/^peak_sgemm_gflops=//p' <<< "$out")
  [[ -n "$peak" ]] || die "gemm_shapes printed no peak_sgemm_gflops line"
  [[ "$peak" =~ ^[0-9]*\.?[0-9]+$ ]] && awk "BEGIN { exit !($peak > 0) }" ||
    die "gemm_shapes printed peak_sgemm_gflops=$peak, not a positive GFLOP/s figure"
  echo "  peak_sgemm_gflops=$peak"
}

# per_seed_report SEEDS WHAT OF: with several seeds, each seed's accuracy and images/s of both
# sides (from ours_acc_runs, ours_ips_runs, peer_acc_runs, peer_ips_runs), then both means and
# sample sds (ours_acc, ours_sd, peer_acc, peer_sd); WHAT names the accuracy ("test accuracy"),
# and `of` is set to OF with the count, for the lines that follow.
per_seed_report() {
  local seeds=$1 what=$2 i
  ((seeds > 1)) || return 0
  echo "per seed: $what, images/s"
  for ((i = 0; i < seeds; i++)); do
    echo "  seed $((i + 1)): hpctrain ${ours_acc_runs[i]}, $(calc "${ours_ips_runs[i]}" 1); peer ${peer_acc_runs[i]}, $(calc "${peer_ips_runs[i]}" 1)"
  done
  echo "hpctrain $what over $seeds seeds: mean $ours_acc, sample sd $ours_sd"
  echo "peer $what over $seeds seeds:     mean $peer_acc, sample sd $peer_sd"
  of=" (${3/N/$seeds})"
}

# The two CPU peer benches (cpu_vs_peer.sh, mpi_vs_peer.sh) share the following; they set
# `seeds`, `epochs`, `smoothing` (smoothing_flag), `tmp`, and locate_programs' names first.

# peer_bench_header NAME SETUP THREADS: the first lines: what runs, the CPU and its ISA (cpu,
# isa), the oneDNN convolution kernels on THREADS threads, the load average.
peer_bench_header() {
  cpu=$(cpu_model) isa=$(cpu_isa)
  local runs=$2
  ((seeds == 1)) || runs+=", seeds 1..$seeds"
  echo "$1: $runs, label smoothing $smoothing"
  echo "cpu: $cpu, ISA $isa"
  print_conv_kernels "$3"
  echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
}

# seed_args S: the --seed flag for run S (array `seed`), none when there is one run (each
# side's default). run_label S: ", seed S of N" in the step headers when there are several.
seed_args() { seed=(); ((seeds == 1)) || seed=(--seed "$1"); }
run_label() { ((seeds == 1)) || echo ", seed $1 of $seeds"; }

# ours_run S STEP COMMAND...: one hpctrain run (seed S; COMMAND with its launcher) writing
# $tmp/ours.jsonl and $tmp/hpctrain.log; sets done_line, adds to ours_ips_runs and ours_acc_runs.
ours_run() {
  local s=$1 step=$2
  shift 2
  echo
  echo "== $step hpctrain$(run_label "$s"): $*"
  rm -f "$tmp/ours.jsonl"
  "$@" --metrics-file "$tmp/ours.jsonl" 2>&1 | tee "$tmp/hpctrain.log" | sed -u 's/^/  /'
  done_line=$(grep '"event":"done"' "$tmp/ours.jsonl" | tail -n 1)
  [[ -n "$done_line" ]] || die "hpctrain wrote no done line to its metrics file"
  ours_ips_runs+=("$(json_number images_per_second <<< "$done_line")")
  ours_acc_runs+=("$(json_number test_accuracy <<< "$done_line")")
}

# peer_run S STEP RANKS: one run of the peer (seed S, RANKS ranks of one thread); sets
# peer_line, adds to peer_ips_runs and peer_acc_runs.
peer_run() {
  seed_args "$1"
  local cmd=("$python" "$peer" --ranks "$3" --threads 1 --epochs "$epochs" "${seed[@]}" "${smoothing_args[@]}")
  echo
  echo "== $2 peer$(run_label "$1"): ${cmd[*]}"
  "${cmd[@]}" 2>&1 | tee "$tmp/peer.log" | sed -u 's/^/  /'
  peer_line=$(grep '"images_per_s"' "$tmp/peer.log" | tail -n 1)
  [[ -n "$peer_line" ]] || die "the peer printed no result line"
  peer_ips_runs+=("$(json_number images_per_s <<< "$peer_line")")
  peer_acc_runs+=("$(json_number test_acc <<< "$peer_line")")
}

# peer_bench_means: both sides' mean images/s and accuracy and the accuracy's sample sd over
# the runs (ours_ips, ours_acc, ours_sd, peer_ips, peer_acc, peer_sd).
peer_bench_means() {
  ours_ips=$(mean "${ours_ips_runs[@]}") ours_acc=$(mean "${ours_acc_runs[@]}") ours_sd=$(sample_sd "${ours_acc_runs[@]}")
  peer_ips=$(mean "${peer_ips_runs[@]}") peer_acc=$(mean "${peer_acc_runs[@]}") peer_sd=$(sample_sd "${peer_acc_runs[@]}")
}

# peer_bench_rates: from peer_bench_means, train_flops and sgemm_peak: ratio (hpctrain's images/s
# over the peer's), gflops (hpctrain's GFLOP/s) and fraction (of the sgemm peak).
peer_bench_rates() {
  ratio=$(calc "$ours_ips / $peer_ips" 2)
  gflops=$(calc "$ours_ips * $flops / 1e9" 1)
  fraction=$(calc "$ours_ips * $flops / 1e9 / $peak" 3)
}

# peer_bench_results ACCURACY OF [OURS_MORE PEER_MORE]: a blank line, the per-seed lines
# (per_seed_report with ACCURACY and OF), then both sides' images/s and ACCURACY (the mean, said
# so, with several seeds), each line ending with its side's MORE.
peer_bench_results() {
  echo
  per_seed_report "$seeds" "$1" "$2"
  echo "hpctrain: $(calc "$ours_ips" 1) images/s, $1 $ours_acc${of:-}${3:-}"
  echo "peer:     $(calc "$peer_ips" 1) images/s, $1 $peer_acc${of:-}${4:-}"
}

# peer_bench_tail: the lines both end their report with, before the summary.
peer_bench_tail() {
  echo "training FLOPs per image: $flops ($flops_source)"
  echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg) (another job on the machine makes all of this noisy)"
  echo
  echo "== summary"
}

# peer_bench_summary: the key=value lines both summaries hold.
peer_bench_summary() {
  cat << EOF
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
}

# The chaos soaks (chaos.sh under hpcrun, chaos_slurm.sh under Slurm) share the following.

# seconds_of DURATION NAME: 90, 90s, 10m, 1h as whole seconds.
seconds_of() {
  [[ "$1" =~ ^([1-9][0-9]*)(s|m|h)?$ ]] || die "$2 must be a duration such as 90s, 10m or 1h, got '$1'"
  local n=${BASH_REMATCH[1]}
  case "${BASH_REMATCH[2]}" in m) n=$((n * 60)) ;; h) n=$((n * 3600)) ;; esac
  echo "$n"
}

# now: the unix time with nanoseconds.
now() { date +%s.%N; }

# chaos_options ARGS...: a soak's options into seed, duration, mean, train_for (seconds), min_kinds and
# only (--kinds: the kinds to draw from, space-separated; empty: all); --help prints the calling
# script's header comment.
chaos_options() {
  seed=1 duration=600 mean=20 min_kinds=6 only="" train_for=""
  while (($#)); do
    case "$1" in
      --kinds) [[ $# -ge 2 && -n "$2" ]] || die "--kinds needs a value"; only=${2//,/ }; shift 2 ;;
      --seed) [[ $# -ge 2 ]] || die "--seed needs a value"; require_count --seed "$2"; seed=$2; shift 2 ;;
      --duration) [[ $# -ge 2 ]] || die "--duration needs a value"; duration=$(seconds_of "$2" --duration); shift 2 ;;
      --mean-interval) [[ $# -ge 2 ]] || die "--mean-interval needs a value"; mean=$(seconds_of "$2" --mean-interval); shift 2 ;;
      --min-kinds) [[ $# -ge 2 ]] || die "--min-kinds needs a value"; require_count --min-kinds "$2"; min_kinds=$2; shift 2 ;;
      --train-for) [[ $# -ge 2 ]] || die "--train-for needs a value"; train_for=$(seconds_of "$2" --train-for); shift 2 ;;
      -h | --help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
      *) die "unknown option '$1'" ;;
    esac
  done
  train_for=${train_for:-$duration}
}

# chaos_kinds KIND[=SECONDS]...: the soak's kinds (as chaos_schedule takes them) into the array
# kinds, only those --kinds named (each must be one of them); with fewer kinds than --min-kinds,
# min_kinds becomes their number.
chaos_kinds() {
  local want k found
  # shellcheck disable=SC2034  # kinds and min_kinds are the caller's
  kinds=("$@")
  [[ -n "${only:-}" ]] || return 0
  kinds=()
  for want in $only; do
    found=""
    for k in "$@"; do [[ "${k%%=*}" == "$want" ]] && found=$k; done
    [[ -n "$found" ]] || die "--kinds: unknown kind '$want' (kinds: ${*%%=*})"
    kinds+=("$found")
  done
  ((${#kinds[@]} >= min_kinds)) || min_kinds=${#kinds[@]}
}

# chaos_schedule SEED DURATION MEAN TARGETS KIND[=LOW:HIGH]...: a soak's faults, one a line: the
# offset from its start, the kind, a target (1..TARGETS) and the fault's own seconds (from LOW to
# HIGH, default 2:6). Gaps are exponential around MEAN, until DURATION; the kinds come in shuffled
# rounds of all of them, so that a short soak still sees each.
chaos_schedule() {
  local seed=$1 d=$2 mean=$3 targets=$4
  shift 4
  awk -v seed="$seed" -v d="$d" -v mean="$mean" -v targets="$targets" -v kinds="$*" 'BEGIN {
    srand(seed); n = split(kinds, k, " "); t = 0; left = 0
    for (i = 1; i <= n; i++) {
      low[i] = 2; span[i] = 4
      if (split(k[i], kv, "=") == 2) {
        if (split(kv[2], lh, ":") != 2) { print "chaos_schedule: " k[i] ": not KIND=LOW:HIGH" > "/dev/stderr"; exit 2 }
        k[i] = kv[1]; low[i] = lh[1]; span[i] = lh[2] - lh[1]
      }
    }
    for (;;) {
      t += -mean * log(1 - rand()); if (t > d) break
      if (left == 0) { for (i = 1; i <= n; i++) bag[i] = i; left = n }
      j = 1 + int(rand() * left); kind = bag[j]; bag[j] = bag[left]; left--
      target = 1 + int(rand() * targets); secs = low[kind] + rand() * span[kind]
      printf "%.1f %s %d %.1f\n", t, k[kind], target, secs
    }}'
}

# chaos_steps METRICS: the soak's training length into steps, from a 40-step calibration run's
# metrics (its rate from step 10 to 40): about --train-for (default --duration) of training, at
# least 60 steps.
chaos_steps() {
  local rate
  rate=$(python3 -c '
import json, sys
t = {e["step"]: e["unix_time"] for e in map(json.loads, open(sys.argv[1])) if e.get("event") == "step"}
print(30 / (t[40] - t[10]))' "$1")
  steps=$(calc "$train_for * $rate" 0)
  ((steps >= 60)) || steps=60
  say "calibration: $(calc "$rate" 1) steps/s; the soak's training: $steps steps"
}

# chaos_sleep_until START OFFSET: sleeps until the unix time START + OFFSET (not at all if past).
chaos_sleep_until() {
  local left
  left=$(awk -v a="$1" -v o="$2" -v n="$(now)" 'BEGIN { printf "%.2f", a + o - n }')
  if awk -v l="$left" 'BEGIN { exit !(l > 0) }'; then sleep "$left"; fi
}

# chaos_leftovers FILE: what the caller's leftovers function lists, into FILE, once it lists
# nothing or after 30 s (processes of a cut host end by their step watchdog, nodes come back).
chaos_leftovers() {
  local i
  for ((i = 0; i < 30; ++i)); do
    leftovers > "$1"
    [[ -s "$1" ]] || return 0
    sleep 1
  done
}

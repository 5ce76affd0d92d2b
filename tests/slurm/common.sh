# shellcheck shell=bash
# What the Slurm tests share: a real local cluster (slurm/local-cluster.sh) of their own, started
# here and stopped with everything in it when the test exits; jobs submitted with the scripts in
# slurm/ as a user would; ways to wait for a job's state and its training's progress.
#
#   slurm_setup NODES          boot the cluster (skips, exit 77, without root or Slurm); more
#                              options of local-cluster.sh up in CLUSTER_ARGS
#   submit NAME SBATCH_ARGS... [-- HPCTRAIN_ARGS...]
#                              sbatch slurm/train.sbatch for this machine's nodes (1 task, 1 CPU,
#                              no GPU per node); checkpoints in $WORK/NAME, output $WORK/NAME.out;
#                              the job id in JOB
#   wait_state JOB STATE SECONDS, wait_step NAME STEP SECONDS, wait_restarts JOB N SECONDS
#   job_field JOB FIELD        a field of `scontrol show job`
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
LOCAL_CLUSTER="$repo/slurm/local-cluster.sh"
: "${HPCTRAIN:?set HPCTRAIN to the hpctrain binary}"
FASHION_MNIST=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
SECONDS=0
FAIL_LOGS=()  # more files whose ends a failure shows (a test adds its own daemons' logs)

say() { echo "[$SECONDS s] $*"; }

# SLURM_TEST_KEEP=DIR keeps the job outputs and the cluster's logs there: of a failed test, or
# wherever a script calls keep_logs.
keep_logs() {
  # (cp fails on the cluster's sockets, which are of no use there.)
  if [[ -n "${SLURM_TEST_KEEP:-}" ]]; then mkdir -p "$SLURM_TEST_KEEP" && cp -r "$TEST_DIR"/. "$SLURM_TEST_KEEP"/ 2> /dev/null || true; fi
}

fail() {
  echo "FAIL: $*" >&2
  local f
  keep_logs
  # Each run's story (the script's lines, srun's, the errors) before the last lines: a tail alone
  # showed the last segment of a job, not the one that failed before it.
  for f in "$WORK"/*.out; do
    [[ -f "$f" ]] || continue
    { echo "--- $f: the script's, srun's and error lines"
      grep -E "^hpctrain-slurm:|^srun:|^slurmstepd|error|[Ss]egmentation|signal|Abort|hpctrain: crashed|stopped at once|resuming from" "$f" | tail -n 80
      echo "--- $f: its last lines"
      tail -n 30 "$f"; } >&2
  done
  for f in "$CLUSTER_DIR/log/slurmctld.log" "${FAIL_LOGS[@]}"; do
    if [[ -f "$f" ]]; then { echo "--- $f"; tail -n 15 "$f"; } >&2; fi
  done
  exit 1
}

slurm_cleanup() {
  local rc=$?
  set +e
  trap - EXIT
  if [[ -n "${WATCHDOG_PID:-}" ]]; then
    local sleeper
    sleeper=$(pgrep -P "$WATCHDOG_PID")
    kill -9 "$WATCHDOG_PID" 2> /dev/null  # first, so that no shell reports its sleep's end
    [[ -n "$sleeper" ]] && kill $sleeper 2> /dev/null
    wait "$WATCHDOG_PID" 2> /dev/null
  fi
  "$LOCAL_CLUSTER" down --dir "$CLUSTER_DIR" > /dev/null || echo "slurm test: 'down' failed" >&2
  rm -rf "$TEST_DIR"
  exit "$rc"
}

# slurm_setup NODES [LIMIT]: a cluster of NODES nodes; the test fails itself (cleaning up) after
# LIMIT seconds (default 300), before CTest's own timeout would kill it and leave daemons behind.
slurm_setup() {
  if ((EUID != 0)); then echo "SKIPPED: the local Slurm cluster needs root"; exit 77; fi
  local c
  for c in slurmctld slurmd munged sbatch; do
    command -v "$c" > /dev/null || { echo "SKIPPED: no $c (Debian packages slurm-wlm and munge)"; exit 77; }
  done
  TEST_DIR=$(mktemp -d /tmp/hpctrain-slurm-test-XXXXXX)
  chmod 755 "$TEST_DIR"
  CLUSTER_DIR="$TEST_DIR/cluster"
  WORK="$TEST_DIR/work"
  mkdir -p "$WORK"
  trap slurm_cleanup EXIT
  trap 'exit 130' INT TERM
  local limit=${2:-300} me=$$
  (sleep "$limit" && echo "FAIL: the test ran past its limit of $limit s" >&2 && kill -TERM "$me") &
  WATCHDOG_PID=$!
  # shellcheck disable=SC2086  # CLUSTER_ARGS: more options of 'up', split on purpose
  "$LOCAL_CLUSTER" up --dir "$CLUSTER_DIR" --nodes "$1" --cpus-per-node 1 ${CLUSTER_ARGS:-} ||
    fail "the cluster did not come up"
  eval "$("$LOCAL_CLUSTER" env --dir "$CLUSTER_DIR")"
  export HPCTRAIN HPCRUN
  cd "$WORK"
}

# A real job, short: cnn on part of Fashion-MNIST, one thread per rank, global batch 128 whatever
# the number of ranks, batch norm over the global batch (so a resume on fewer ranks changes
# nothing beyond rounding).
train_args() {
  echo --device cpu --data-dir "$FASHION_MNIST" --model cnn --global-batch-size 128 --sync-batch-norm \
    --train-samples "${TRAIN_SAMPLES:-8000}" --test-samples 2000 --epochs "${EPOCHS:-1}" --log-every 10 \
    --step-timeout "${STEP_TIMEOUT:-60s}"
}

# The sbatch options that fit slurm/train.sbatch's #SBATCH lines (GPU nodes) to this machine.
LOCAL_FIT=(--ntasks-per-node=1 --gpus-per-node=0 --cpus-per-task=1)

submit() {
  local name=$1 sb=() tr=()
  shift
  while (($#)) && [[ "$1" != -- ]]; do sb+=("$1"); shift; done
  (($#)) && shift
  tr=("$@")
  # shellcheck disable=SC2046
  JOB=$(CHECKPOINT_DIR="$WORK/$name" sbatch --parsable --job-name="$name" --output="$WORK/$name.out" \
    "${LOCAL_FIT[@]}" "${sb[@]}" "$repo/slurm/train.sbatch" $(train_args) "${tr[@]}") ||
    fail "sbatch refused the job $name"
  say "submitted $name as job $JOB"
}

# (Every reader in these pipelines reads to the end: under pipefail, one that stops early would
# fail the pipeline with its writer's SIGPIPE.)
job_field() {
  scontrol show job -o "$1" 2> /dev/null | tr ' ' '\n' | awk -v k="$2=" 'index($0, k) == 1 && !n++ { print substr($0, length(k) + 1) }'
}

# wait_state JOB STATE SECONDS: until the job is in STATE (a regular expression); fails at once on
# another final state.
wait_state() {
  local deadline=$((SECONDS + $3)) s
  while :; do
    s=$(job_field "$1" JobState)
    [[ "$s" =~ ^($2)$ ]] && return 0
    [[ "$s" =~ ^(COMPLETED|FAILED|CANCELLED|TIMEOUT|OUT_OF_MEMORY|DEADLINE|BOOT_FAIL)$ ]] &&
      fail "job $1 ended $s (exit code $(job_field "$1" ExitCode)), not $2"
    ((SECONDS < deadline)) || fail "job $1 is ${s:-gone}, not $2, after $3 s"
    sleep 0.5
  done
}

wait_restarts() {  # wait_restarts JOB N SECONDS: until Slurm has requeued the job N times
  local deadline=$((SECONDS + $3)) n
  while :; do
    n=$(job_field "$1" Restarts)
    ((${n:-0} >= $2)) && return 0
    ((SECONDS < deadline)) || fail "job $1 was requeued ${n:-0} times, not $2, within $3 s"
    sleep 0.5
  done
}

# The global step in a job's heartbeat (0 before the first).
step_of() { sed -n 's/^step=//p' "$WORK/$1/heartbeat" 2> /dev/null || true; }

# wait_step NAME STEP SECONDS [NEWER_THAN]: until the heartbeat shows at least STEP (and, with
# NEWER_THAN, was written after that file); fails at once when the job $JOB has ended.
wait_step() {
  local deadline=$((SECONDS + $3)) s
  while :; do
    s=$(step_of "$1")
    if ((${s:-0} >= $2)) && { [[ -z "${4:-}" ]] || [[ "$WORK/$1/heartbeat" -nt "$4" ]]; }; then return 0; fi
    ((SECONDS < deadline)) || fail "$1 did not reach step $2 within $3 s (at ${s:-none})"
    if [[ -n "${JOB:-}" && "$(job_field "$JOB" JobState)" =~ ^(COMPLETED|FAILED|CANCELLED|TIMEOUT)$ ]]; then
      fail "job $JOB ended $(job_field "$JOB" JobState) before $1 reached step $2 (at ${s:-none})"
    fi
    sleep 0.2
  done
}

# What the job's runs printed (all of them: --open-mode=append).
out_of() { cat "$WORK/$1.out"; }
expect_out() { grep -q -- "$2" "$WORK/$1.out" || fail "$1's output lacks '$2'"; }

# The `done` line of the job's metrics, and a number or string from it.
done_field() {
  grep '"event":"done"' "$WORK/$1/metrics.jsonl" 2> /dev/null | tail -1 |
    sed -n "s/.*\"$2\":\"\{0,1\}\([^\",}]*\).*/\1/p"
}

# The steps each run resumed from, in order ("resuming from ... at step N"), and those after which
# a run stopped on a signal with a checkpoint ("stopped on request ... after step N;").
resumed_steps() { sed -n 's/.*resuming from .* at step \([0-9]*\) .*/\1/p' "$WORK/$1.out" | tr '\n' ' '; }
stopped_steps() { sed -n 's/.*stopped on request .* after step \([0-9]*\);.*/\1/p' "$WORK/$1.out" | tr '\n' ' '; }

# Two neighbouring free ports below the kernel's ephemeral range (32768 up), as slurmctld and
# slurmd take: a port picked from that range can be any connection's source port a moment later
# (a CI run's slurmd found its port, the ephemeral pick plus one, taken and never came up).
free_port_pair() {
  python3 -c '
import random, socket
for _ in range(200):
    p = random.randrange(20000, 32000)
    try:
        for q in (p, p + 1):
            with socket.socket() as s:
                s.bind(("0.0.0.0", q))
    except OSError:
        continue
    print(p)
    break
else:
    raise SystemExit("no two free neighbouring ports")'
}
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

#!/usr/bin/env bash
# Chaos soak under Slurm: one sbatch job (slurm/train.sbatch, as a user submits it) on a real local
# cluster of three nodes (slurm/local-cluster.sh --preemption, as tests/slurm boot it) while a
# seeded random schedule of Slurm's faults hits it, then the final state_checksum against an
# undisturbed job of the same options. The job is tests/slurm's cnn (one thread a rank, global
# batch 128, checkpoints every 10 steps, snapshots in each node's memory, --step-timeout 10s) on
# 2 of the 3 nodes for every run: a node that is DOWN leaves a spare, and every run has the same
# 2 ranks, so the comparison is exact (README: resume is bit for bit on the same number of ranks).
# Faults, drawn in shuffled rounds of every kind (so a short soak still sees each), after gaps
# exponential around --mean-interval, each once the job has trained a step since the last, on one
# of the job's two nodes where they need one:
#   requeue    scontrol requeue JOB (SIGTERM: the job checkpoints, Slurm requeues it)
#   preempt    a job on partition high takes the job's nodes (Slurm's preemption, GraceTime 20 s)
#   node_down  scontrol update nodename=NODE state=down reason=chaos, RESUMEd 2..6 s later (unless
#              back by itself: local-cluster.sh has ReturnToService=2)
#   node_kill  local-cluster.sh kill-node NODE (its slurmd and every process of the job there, its
#              /dev/shm with them); start-node 2..6 s after Slurm has marked it DOWN
#   usr1       scancel --signal=USR1 --batch JOB (the warning signal: the script requeues the job)
#   rank_kill  SIGKILL of the job's rank on that node (the other rank's watchdog ends the run)
# Printed (bench/chaos_report.py, as chaos.sh's): faults by kind, survived, steps redone (in all,
# per fault), time from each fault to the next step (median, p95, max), time lost as a share of
# the soak, and what was left behind: processes of the soak's jobs on any node, files in each
# node's /dev/shm, the checkpoint folder's lock, temporary files and membership-change, nodes not
# idle (DOWN, DRAINED), jobs left in the queue. Exit 1 when the checksum differs or something is
# left behind, or when fewer than --min-kinds (6) kinds were injected. The schedule is drawn for
# --duration; a fault waits for the job to train again after the last, so the soak lasts longer.
# The training lasts --train-for of undisturbed training (default: --duration).
# Usage: sudo bench/chaos_slurm.sh [--seed N] [--duration 10m] [--mean-interval 20s] [--min-kinds 6]
#        [--train-for 10m] [--kinds requeue,node_kill,...] (default: all of them)
# Environment: BUILD_DIR (default build), HPCTRAIN (the binary), FASHION_MNIST (the dataset),
# SLURM_TEST_KEEP (a folder that keeps the soak's job outputs, metrics and the cluster's logs).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
build_paths
chaos_options "$@"
[[ -x "$HPCTRAIN" ]] || die "build first (./setup.sh): $HPCTRAIN"
source "$root/tests/slurm/common.sh"
chaos_kinds requeue preempt node_down node_kill usr1 rank_kill
# Its own limit: the reference, the soak (faults wait for training) and recoveries, with room.
CLUSTER_ARGS="--preemption 20" slurm_setup 3 $(((duration + train_for) * 3 + 1200))
export TRAIN_SAMPLES=8000 STEP_TIMEOUT=10s
# The batch script requeues the job itself after a warning signal or a failed run, at most
# MAX_REQUEUES times (sbatch passes this environment on).
export MAX_REQUEUES=100000
jobs_submitted=""

# train NAME STEPS: submit the soak's job, STEPS steps long, metrics of every step, on 2 nodes.
train() {
  local epochs=$(((($2) + 61) / 62))  # 8000 samples at a global batch of 128: 62 steps an epoch
  EPOCHS=$epochs submit "$1" --nodes=2 -- --max-steps "$2" --metrics-every-steps 1 \
    --checkpoint-every-steps 10 --checkpoint-interval 0
  jobs_submitted+=" $JOB"
}

# Steps a second, from a 40-step job: the soak's training is sized to last about --duration.
train cal 40
wait_state "$JOB" COMPLETED 300
chaos_steps "$WORK/cal/metrics.jsonl"

say "undisturbed reference job"
ref_start=$(now)
train ref "$steps"
wait_state "$JOB" COMPLETED $((train_for * 3 + 300))
ref_end=$(now)

# The schedule: offsets from the start, kind, which of the job's 2 nodes, the fault's own seconds.
schedule=$(chaos_schedule "$seed" "$duration" "$mean" 2 "${kinds[@]}")
metrics=$WORK/chaos/metrics.jsonl faults=$WORK/faults.tsv
: > "$faults"

# A run of the job started after unix time $1 has finished a step: 0; the training is over: 1.
# (A run that Slurm stops may still finish a step or two after the fault.)
trained_since() {
  local deadline=$((SECONDS + 300)) line started state
  while :; do
    line=$(tail -n 20 "$metrics" 2> /dev/null | grep '"event":"\(step\|done\)"' | tail -n 1 || true)
    [[ "$line" == *'"event":"done"'* ]] && return 1
    started=$(grep '"event":"config"' "$metrics" 2> /dev/null | tail -n 1 | json_number unix_time || true)
    if [[ "$line" == *'"event":"step"'* && -n "$started" ]] &&
      awk -v s="$(json_number unix_time <<< "$line")" -v c="$started" -v t="$1" 'BEGIN { exit !(c > t && s > c) }'; then
      return 0
    fi
    state=$(job_field "$JOB" JobState)
    [[ "$state" == COMPLETED ]] && return 1
    [[ "$state" =~ ^(FAILED|CANCELLED|TIMEOUT|OUT_OF_MEMORY|DEADLINE|BOOT_FAIL|NODE_FAIL)$ ]] &&
      fail "job $JOB ended $state during the soak"
    ((SECONDS < deadline)) || fail "no training step for 300 s after the fault at $1 (the job is ${state:-gone})"
    sleep 0.2
  done
}

# job_node K: the job's K-th node (1 or 2) now.
job_node() { scontrol show hostnames "$(job_field "$JOB" NodeList)" | sed -n "${1}p"; }

# node_state NODE: its state in sinfo (idle, allocated, down*, drained, ...).
node_state() { sinfo -h -N -n "$1" -o %T | head -n 1; }

# rank_pid K: the pid of the job's rank K-1 (SLURM_PROCID), empty if none.
rank_pid() {
  local p env
  for p in $(pgrep -x hpctrain || true); do
    env=$(tr '\0' '\n' 2> /dev/null < "/proc/$p/environ") || continue
    [[ $'\n'"$env"$'\n' == *$'\n'"SLURM_JOB_ID=$JOB"$'\n'* && $'\n'"$env"$'\n' == *$'\n'"SLURM_PROCID=$(($1 - 1))"$'\n'* ]] &&
      { echo "$p"; return 0; }
  done
  return 0
}

# node_resume NODE: RESUME it unless it is back already (ReturnToService=2 returns a DOWN node
# as soon as its slurmd answers, local-cluster.sh's setting); again while Slurm refuses (the
# node still ends the job's processes). Prints how it came back.
node_resume() {
  local deadline=$((SECONDS + 120))
  while [[ "$(node_state "$1")" == down* ]]; do
    scontrol update nodename="$1" state=resume 2> /dev/null && { echo "resumed"; return 0; }
    ((SECONDS < deadline)) || fail "node $1 still $(node_state "$1") 120 s after it was set down"
    sleep 0.5
  done
  echo "back by itself ($(node_state "$1"): ReturnToService=2)"
}

# inject KIND K SECONDS: the fault on the job's K-th node, then one line in faults.tsv (start,
# end, kind, node, detail); injected=0 where it found nothing to hit.
inject() {
  local kind=$1 node start pid high detail="" restarts
  injected=0
  node=$(job_node "$2")
  restarts=$(job_field "$JOB" Restarts)
  start=$(now)
  case "$kind" in
    requeue) scontrol requeue "$JOB"; node="" ;;
    preempt)
      high=$(sbatch --parsable -p high -N 2 -w "$(job_field "$JOB" NodeList)" --ntasks-per-node=1 \
        --cpus-per-task=1 -o "$WORK/high-%j.out" --wrap 'echo "high ran on $SLURM_JOB_NODELIST at $(date +%s.%N)"') ||
        fail "sbatch -p high refused the job"
      jobs_submitted+=" $high"
      wait_state "$high" COMPLETED 120
      detail="job $high on partition high took $(job_field "$high" NodeList)"
      node="" ;;
    node_down)
      scontrol update nodename="$node" state=down reason=chaos
      sleep "$3"
      detail="after $3 s: $(node_resume "$node")" ;;
    node_kill)
      "$LOCAL_CLUSTER" kill-node "$node" --dir "$CLUSTER_DIR" > /dev/null
      local deadline=$((SECONDS + 120))
      until [[ "$(node_state "$node")" == down* ]]; do
        ((SECONDS < deadline)) || fail "Slurm did not mark $node down within 120 s of its slurmd's death"
        sleep 0.5
      done
      detail="marked down after $(calc "$(now) - $start" 1) s, its slurmd started $3 s later"
      sleep "$3"
      "$LOCAL_CLUSTER" start-node "$node" --dir "$CLUSTER_DIR" > /dev/null || fail "node $node did not come back" ;;
    usr1) scancel --signal=USR1 --batch "$JOB"; node="" ;;
    rank_kill)
      pid=$(rank_pid "$2")
      [[ -n "$pid" ]] || { say "no rank $(($2 - 1)) of job $JOB found: rank_kill skipped"; return 0; }
      start=$(now)
      kill -KILL "$pid" 2> /dev/null || true
      detail="rank $(($2 - 1)), pid $pid" ;;
  esac
  injected=1
  printf '%s\t%s\t%s\t%s\t%s\n' "$start" "$(now)" "$kind" "$node" "$detail" >> "$faults"
  say "fault: $kind${node:+ on $node}${detail:+ ($detail)}"
  # Every kind ends the run and Slurm requeues the job: the next fault waits for a step of the
  # next run, not one the stopping run still finished.
  wait_restarts "$JOB" $((restarts + 1)) 180
}

say "the soak: seed $seed, faults for $duration s, every $mean s on average"
chaos_start=$(now)
train chaos "$steps"
chaos_job=$JOB
last_fault=$chaos_start
while read -r -u 3 at kind k secs; do
  [[ -n "$at" ]] || continue
  chaos_sleep_until "$chaos_start" "$at"
  trained_since "$last_fault" || break
  t=$(now)
  inject "$kind" "$k" "$secs"
  ((injected)) && last_fault=$t
done 3<<< "$schedule"
wait_state "$JOB" COMPLETED $((train_for * 3 + 600))
chaos_end=$(now)
restarts=$(job_field "$JOB" Restarts)
say "the soak's training finished: job $JOB, requeued $restarts time(s)"

# What is left behind, one "what<TAB>detail" line each: processes of the soak's jobs on any node
# (their tasks and batch scripts by SLURM_JOB_ID in their environment, slurmstepd by its title
# "slurmstepd: [JOB.STEP]"), files in each node's /dev/shm, the checkpoint folder's lock,
# temporary files and membership-change, nodes not idle, jobs in the queue.
leftovers() {
  local n pid p
  JOBS="$jobs_submitted" python3 -c '
import os
jobs = os.environ["JOBS"].split()
for p in filter(str.isdigit, os.listdir("/proc")):
    try: c, e = open(f"/proc/{p}/cmdline", "rb").read(), open(f"/proc/{p}/environ", "rb").read().split(b"\0")
    except OSError: continue
    if any(f"SLURM_JOB_ID={j}".encode() in e or f"slurmstepd: [{j}.".encode() in c for j in jobs):
        print("process\tpid", p, c.replace(b"\0", b" ").decode(errors="replace")[:120])'
  for n in $NODES; do
    pid=$(cat "$CLUSTER_DIR/run/slurmd-$n.pid" 2> /dev/null || true)
    if [[ -z "$pid" ]] || ! kill -0 "$pid" 2> /dev/null; then
      printf 'node\t%s: its slurmd is not running\n' "$n"
      continue
    fi
    # (The user's snapshot directory itself, /dev/shm/hpctrain-UID, stays as /tmp does.)
    nsenter -t "$pid" -m find /dev/shm -mindepth 1 2> /dev/null | grep -v '^/dev/shm/hpctrain-[0-9]*$' |
      sed "s|^|shm\tnode $n: |" || true
  done
  for p in "$WORK/chaos/lock" "$WORK/chaos"/ckpt-*.tmp.* "$WORK/chaos/heartbeat.tmp" "$WORK/chaos/membership-change"; do
    [[ -e "$p" ]] && printf 'checkpoint folder\t%s\n' "$p"
  done
  sinfo -h -N -o '%N %T %E' | sort -u | awk '$2 != "idle" { n = $1; $1 = ""; printf "node\t%s:%s\n", n, $0 }'
  squeue -h -o '%i %j %T %R' | sed 's/^/job in the queue\t/'
  return 0
}
NODES=$(source "$CLUSTER_DIR/cluster.env" && echo "$NODES")
chaos_leftovers "$WORK/left.tsv"

python3 "$root/bench/chaos_report.py" --ref "$WORK/ref/metrics.jsonl" --run "$metrics" --faults "$faults" \
  --left "$WORK/left.tsv" --times "$ref_start" "$ref_end" "$chaos_start" "$chaos_end" --seed "$seed" \
  --duration "$duration" --mean-interval "$mean" --min-kinds "$min_kinds" --job "cnn, Slurm job of 2 nodes x 1 rank" \
  --note "Slurm: job $chaos_job requeued $restarts time(s)" > "$WORK/report.txt" || verdict=$?
cat "$WORK/report.txt"
keep_logs
[[ ${verdict:-0} == 0 ]] || fail "the soak failed (above)"
say "PASS"

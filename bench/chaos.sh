#!/usr/bin/env bash
# Chaos soak: one training under hpcrun on three local hosts (network namespaces, each a real SSH
# server, as in tests/launch/) while a seeded random schedule of faults hits it, then the final
# state_checksum against an undisturbed run of the same options. The job is the default cnn
# (tests/launch/common.sh's: one thread a rank, checkpoints on shared storage every 10 steps,
# snapshots in host memory), with -np 3 --min-np 3: a host that fails is blacklisted for a short
# cooldown and the job waits for it, so every attempt has the same 3 ranks and the comparison is
# exact (README: resume is bit for bit on the same number of ranks). Faults, drawn in shuffled
# rounds of every kind (so a short soak still sees each), after gaps exponential around
# --mean-interval, each once the job has trained a step since the last:
#   rank_kill  SIGKILL of one rank              host_kill  SIGKILL of every process of a host (sshd
#   link_cut   its link down for 2..6 s                    too), rebooted 2..6 s later
#   rank_stop  SIGSTOP of a rank, SIGCONT after 2..12 s (past --step-timeout 8 s: a failure)
#   ckpt_kill  SIGKILL of rank 0 while it writes a checkpoint (its temporary file ckpt-*.hpck.tmp.PID)
#   preempt    SIGTERM or SIGUSR1 to hpcrun: the job checkpoints and stops (75), a second hpcrun
#              resumes it
#   host_leave a host leaves the discovery script's output for 3..10 s and returns (hpcrun drains
#              the job off it, waits for --min-np, grows back)
#   shm_full   rank 0's host killed and rebooted with its snapshot tmpfs (/dev/shm) full for
#              10..20 s: the job comes back there and cannot write snapshots for a while
# Printed: faults by kind, survived, steps redone (in all, per fault), time from each fault to the
# next step (median, p95, max), time lost as a share of the run, and what was left behind
# (processes, /dev/shm files, checkpoint-folder locks and temporary files, hosts left out, hpcrun's
# open file descriptors). Exit 1 when the checksum differs or something is left behind.
# The schedule is drawn for --duration; a fault waits for the job to train again after the last,
# so the soak lasts longer. It fails too when fewer than --min-kinds (6) kinds were injected.
# The training lasts --train-for of undisturbed training (default: --duration): faults that come
# close together (a short --mean-interval) follow each other's recoveries, so the last ones need
# the training to go on past the schedule.
# Usage: sudo bench/chaos.sh [--seed N] [--duration 10m] [--mean-interval 20s] [--min-kinds 6]
#        [--train-for 10m] [--kinds rank_kill,shm_full,...] (default: all of them)
# Environment: BUILD_DIR (default build), HPCRUN and HPCTRAIN (binaries), HPCRUN_TEST_KEEP (a
# folder that keeps the soak's logs), CHAOS_NETNS_ID (the hosts' namespace id, default 22).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
build_paths

chaos_options "$@"
[[ -x "$HPCRUN" && -x "$HPCTRAIN" ]] || die "build first (./setup.sh): $HPCRUN"
source "$root/tests/launch/common.sh"
netns_require
netns_setup "${CHAOS_NETNS_ID:-22}" 3  # another id: two soaks (or the soak and CTest's) at once
export TRAIN_SAMPLES=12000 STEP_TIMEOUT=8s
# The kinds and their seconds (preempt's: SIGTERM under 4, SIGUSR1 from 4).
chaos_kinds rank_kill host_kill link_cut rank_stop=2:12 ckpt_kill preempt host_leave=3:10 shm_full=10:20
# The hosts come from a discovery script (host_leave takes one out of its output for a while).
discovered=$NETNS_DIR/discovered discover=$NETNS_DIR/discover.sh
printf '%s:1\n' "${NETNS_HOSTS[1]}" "${NETNS_HOSTS[2]}" "${NETNS_HOSTS[3]}" > "$discovered"
printf '#!/bin/sh\ncat %s\n' "$discovered" > "$discover"
chmod +x "$discover"
# The same for the reference and the soak. --elastic-timeout: a host kept out for good (a
# blacklist entry never cleared) ends the soak within a minute instead of waiting 10.
# --probe-timeout: hpcrun's default, 10 s. A probe is a whole ssh login, and a login here runs the
# machine's own shell start-up (root's .bashrc: pyenv init, 4 s of it under a load of 12 on 2 cores);
# three at once took over 5 s for a minute, every host was blacklisted by turns, and hpcrun gave up
# after --elastic-timeout with every host alive (seed 3, 2026-12-04). A cut host's probe fails after
# it all the same.
hpcrun_args=(--host-discovery-script "$discover" --discovery-interval 1s -np 3 --min-np 3 --max-np 3
  --blacklist-cooldown 1s:4s --max-restarts 100000 --teardown-timeout 3s --stall-timeout 30s --start-timeout 2m
  --probe-timeout 10s --elastic-timeout 60s --quiet)

# train NAME STEPS: hpcrun_start with the soak's job, STEPS steps long, metrics of every step.
train() {
  local epochs=$(((($2) + 61) / 62))  # 12000 samples at a global batch of 192: 62 steps an epoch
  EPOCHS=$epochs TRAIN_EXTRA="--max-steps $2 --metrics-every-steps 1 --metrics-file $NETNS_DIR/$1.jsonl" \
    hpcrun_start "$1" "${hpcrun_args[@]}"
}

# Steps a second, from a 40-step run: the soak's training is sized to last about --duration.
train cal 40
hpcrun_wait 180
[[ $RC == 0 ]] || fail "the calibration run ended with $RC"
chaos_steps "$NETNS_DIR/cal.jsonl"

say "undisturbed reference run"
ref_start=$(now)
train ref "$steps"
hpcrun_wait $((train_for * 3 + 120))
ref_end=$(now)
[[ $RC == 0 ]] || fail "the undisturbed run ended with $RC"

# The schedule: offsets from the start, kind, host (1..3), the fault's own seconds.
schedule=$(chaos_schedule "$seed" "$duration" "$mean" 3 "${kinds[@]}")

ck=$NETNS_DIR/chaos faults=$NETNS_DIR/faults.tsv fds=$NETNS_DIR/fds.tsv
: > "$faults"
: > "$fds"
invocation=1

# rank_pid K: the pid of the newest hpctrain process on host K (empty if none).
rank_pid() {
  local p best=""
  for p in $(ip netns pids "hpt${NETNS_ID}h$1" 2> /dev/null); do
    [[ "$(cat "/proc/$p/comm" 2> /dev/null)" == hpctrain ]] && ((p > ${best:-0})) && best=$p
  done
  echo "$best"
}

# rank0_host: the host (1..3) of the newest rank 0 (empty if none runs).
rank0_host() {
  local k p
  for ((k = 1; k <= 3; ++k)); do
    p=$(rank_pid "$k")
    [[ -n "$p" ]] && tr '\0' '\n' < "/proc/$p/environ" 2> /dev/null | grep -qx OMPI_COMM_WORLD_RANK=0 && { echo "$k"; return 0; }
  done
  return 0
}

# shm_size K SIZE: remount host K's /dev/shm with tmpfs size SIZE ("full": no more than it holds
# now, so the next new page fails with ENOSPC; a snapshot written meanwhile can make the remount
# fail, so it is tried a few times). 0 on success.
shm_size() {
  local sshd i b f bs size=$2
  sshd=$(cat "$NETNS_DIR/ssh/h$1/sshd.pid" 2> /dev/null) || return 1
  for ((i = 0; i < 20; ++i)); do
    if [[ $2 == full ]]; then
      read -r b f bs < <(nsenter -t "$sshd" -m stat -f -c '%b %f %S' /dev/shm) || return 1
      size=$(((b - f) * bs))
      ((size > 0)) || size=$bs
    fi
    nsenter -t "$sshd" -m mount -o "remount,size=$size" /dev/shm 2> /dev/null && return 0
    sleep 0.05
  done
  return 1
}

# hpcrun ended by itself (not after a preemption, which inject handles): 0 is the end.
hpcrun_ended() {
  RC=0
  wait "$HPCRUN_PID" || RC=$?
  reaped=$HPCRUN_PID
  cp "$ck/hpcrun/summary.json" "$NETNS_DIR/summary-$invocation.json" 2> /dev/null || true
  [[ $RC == 0 ]] || fail "hpcrun ended with $RC during the soak"
}

# The job has finished a step after unix time $1: 0; the training is over: 1.
trained_since() {
  local deadline=$((SECONDS + 180)) line
  while :; do
    line=$(tail -n 1 "$NETNS_DIR/chaos.jsonl" 2> /dev/null || true)
    [[ "$line" == *'"event":"done"'* ]] && return 1
    if [[ "$line" == *'"event":"step"'* ]] && awk -v a="$(json_number unix_time <<< "$line")" -v b="$1" 'BEGIN { exit !(a > b) }'; then
      return 0
    fi
    kill -0 "$HPCRUN_PID" 2> /dev/null || { hpcrun_ended && return 1; }
    ((SECONDS < deadline)) || fail "no training step for 180 s after the fault at $1"
    sleep 0.2
  done
}

# ckpt_write_pid: rank 0's pid once it writes a checkpoint (its temporary file), within 60 s.
ckpt_write_pid() {
  local deadline=$((SECONDS + 60)) f p
  while ((SECONDS < deadline)); do
    for f in "$ck"/ckpt-*.hpck.tmp.*; do
      p=${f##*.}
      [[ -e "$f" && "$(cat "/proc/$p/comm" 2> /dev/null)" == hpctrain ]] && { echo "$p"; return 0; }
    done
    sleep 0.01
  done
  return 1
}

# inject KIND HOST SECONDS: the fault, then one line in faults.tsv (start, end, kind, host, detail).
inject() {
  local kind=$1 k=$2 secs=$3 start pid detail=""
  start=$(now)
  case "$kind" in
    rank_kill | rank_stop)
      pid=$(rank_pid "$k")
      [[ -n "$pid" ]] || { say "no rank on host $k: $kind skipped"; return 0; }
      start=$(now)
      if [[ $kind == rank_kill ]]; then
        kill -KILL "$pid" 2> /dev/null || true
      else
        kill -STOP "$pid" 2> /dev/null || true
        sleep "$secs"
        kill -CONT "$pid" 2> /dev/null || true
        detail="${secs} s"
      fi ;;
    host_kill) netns_kill_host "$k"; sleep "$secs"; netns_boot_host "$k"; detail="down ${secs} s" ;;
    link_cut) netns_cut_host "$k"; sleep "$secs"; netns_mend_host "$k"; detail="down ${secs} s" ;;
    ckpt_kill)
      k=1
      pid=$(ckpt_write_pid) || { say "no checkpoint write seen within 60 s: ckpt_kill skipped"; return 0; }
      start=$(now)
      kill -KILL "$pid" 2> /dev/null || true
      detail="rank 0, pid $pid" ;;
    host_leave)
      grep -v "^${NETNS_HOSTS[k]}:" "$discovered" > "$discovered.new" && mv "$discovered.new" "$discovered"
      sleep "$secs"
      printf '%s:1\n' "${NETNS_HOSTS[k]}" >> "$discovered"
      detail="out of the discovery output ${secs} s" ;;
    shm_full)
      # A snapshot rewrites the pages of the one before (the store keeps them), so a tmpfs that
      # fills up under a running job changes nothing; a host that comes back with a full one
      # does: rank 0 cannot write its first snapshot there.
      k=$(rank0_host)
      [[ -n "$k" ]] || { say "no rank 0 running: shm_full skipped"; return 0; }
      start=$(now)
      netns_kill_host "$k"
      netns_boot_host "$k"
      shm_size "$k" full || fail "host $k's /dev/shm could not be made full"
      sleep "$secs"
      shm_size "$k" 50% || fail "host $k's /dev/shm could not be given its size back"
      detail="rank 0's host rebooted with a full /dev/shm for ${secs} s" ;;
    preempt)
      k=0
      local sig=TERM
      awk -v s="$secs" 'BEGIN { exit !(s >= 4) }' && sig=USR1
      kill -"$sig" "$HPCRUN_PID"
      hpcrun_wait 300
      [[ $RC == 75 ]] || fail "hpcrun ended with $RC after SIG$sig, not 75"
      cp "$ck/hpcrun/summary.json" "$NETNS_DIR/summary-$invocation.json"
      mv "$NETNS_DIR/chaos.err" "$NETNS_DIR/chaos.err.$invocation"
      mv "$NETNS_DIR/chaos.out" "$NETNS_DIR/chaos.out.$invocation"
      invocation=$((invocation + 1))
      train chaos "$steps"
      detail="SIG$sig, stopped with 75, hpcrun started again" ;;
  esac
  printf '%s\t%s\t%s\t%s\t%s\n' "$start" "$(now)" "$kind" "$k" "$detail" >> "$faults"
  say "fault: $kind${k:+ on host $k}${detail:+ ($detail)}"
}

# hpcrun's open file descriptors [and their targets into FILE]: the fewest of five looks 0.15 s
# apart. Its discovery script (every second here) and its health probes run as its children with
# up to three pipes open for a moment each; one look can catch them (CI once counted 13 where the
# listing a moment later had 12). A leaked descriptor stays in every look.
hpcrun_fds() {
  local best="" look targets
  for look in 1 2 3 4 5; do
    mapfile -t targets < <(ls -l "/proc/$HPCRUN_PID/fd" 2> /dev/null | awk 'NR > 1 { print $NF }')
    if [[ -z "$best" || ${#targets[@]} -lt $best ]]; then
      best=${#targets[@]}
      [[ -z "${1:-}" ]] || printf '%s\n' "${targets[@]}" > "$1"
    fi
    ((look == 5)) || sleep 0.15
  done
  echo "$best"
}
say "the soak: seed $seed, faults for $duration s, every $mean s on average"
chaos_start=$(now)
train chaos "$steps"
last_end=$chaos_start
while read -r -u 3 at kind k secs; do
  [[ -n "$at" ]] || continue
  chaos_sleep_until "$chaos_start" "$at"
  trained_since "$last_end" || break
  printf '%s\t%s\t%s\n' "$(now)" "$invocation" "$(hpcrun_fds)" >> "$fds"
  inject "$kind" "$k" "$secs"
  last_end=$(now)
done 3<<< "$schedule"
# The fds near the end: the last attempt's, while it trains.
if kill -0 "$HPCRUN_PID" 2> /dev/null && trained_since "$(now)"; then
  printf '%s\t%s\t%s\n' "$(now)" "$invocation" "$(hpcrun_fds "$NETNS_DIR/fds-end.txt")" >> "$fds"
fi
# Its exit code, unless hpcrun_ended has it: RC may still hold an earlier hpcrun's (a preemption's
# 75), and kill -0 fails once bash has reaped a hpcrun that ended by itself, so neither tells.
if [[ "${reaped:-}" != "$HPCRUN_PID" ]]; then
  hpcrun_wait $((train_for * 3 + 300))
  cp "$ck/hpcrun/summary.json" "$NETNS_DIR/summary-$invocation.json"
fi
chaos_end=$(now)
[[ $RC == 0 ]] || fail "the soak's hpcrun ended with $RC"
say "the soak's training finished"

# What is left behind, one "what<TAB>detail" line each, after up to 30 s for the processes of
# a cut host to end (their step watchdog).
leftovers() {
  local k sshd p
  for ((k = 1; k <= NETNS_COUNT; ++k)); do
    sshd=$(cat "$NETNS_DIR/ssh/h$k/sshd.pid")
    for p in $(ip netns pids "hpt${NETNS_ID}h$k" 2> /dev/null); do
      ((p == sshd)) || printf 'process\thost %s: pid %s %s\n' "$k" "$p" "$(tr '\0' ' ' < "/proc/$p/cmdline" 2> /dev/null | cut -c1-120)"
    done
    nsenter -t "$sshd" -m find /dev/shm -mindepth 1 -type f 2> /dev/null | sed "s/^/shm\thost $k: /" || true
  done
  NETNS_DIR=$NETNS_DIR python3 -c '
import os
d, net = os.environ["NETNS_DIR"].encode(), os.readlink("/proc/self/ns/net")
for p in filter(str.isdigit, os.listdir("/proc")):  # those in the hosts are listed above
    try: c, n = open(f"/proc/{p}/cmdline", "rb").read(), os.readlink(f"/proc/{p}/ns/net")
    except OSError: continue
    if d in c and n == net and int(p) != os.getpid(): print("process\tpid", p, c.replace(b"\0", b" ").decode()[:120])'
  for p in "$ck/lock" "$ck"/ckpt-*.tmp.* "$ck/heartbeat.tmp" "$ck/membership-change"; do
    [[ -e "$p" ]] && printf 'checkpoint folder\t%s\n' "$p"
  done
  return 0
}
chaos_leftovers "$NETNS_DIR/left.tsv"

summaries=("$NETNS_DIR"/summary-*.json)
[[ -e "${summaries[0]}" ]] || summaries=()
python3 "$root/bench/chaos_report.py" --ref "$NETNS_DIR/ref.jsonl" --run "$NETNS_DIR/chaos.jsonl" \
  --faults "$faults" --left "$NETNS_DIR/left.tsv" --times "$ref_start" "$ref_end" "$chaos_start" "$chaos_end" \
  --seed "$seed" --duration "$duration" --mean-interval "$mean" --min-kinds "$min_kinds" --job "cnn, 3 hosts x 1 rank" \
  --hpcrun-summaries "${summaries[@]}" --hosts "${NETNS_HOSTS[1]},${NETNS_HOSTS[2]},${NETNS_HOSTS[3]}" \
  --fds "$fds" --fds-end "$NETNS_DIR/fds-end.txt" > "$NETNS_DIR/report.txt" || verdict=$?
cat "$NETNS_DIR/report.txt"
keep_logs
[[ ${verdict:-0} == 0 ]] || fail "the soak failed (above)"
say "PASS"

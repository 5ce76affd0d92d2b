#!/usr/bin/env bash
# hpcrun's recovery time: from a failure to the first training step of the relaunched job, for
# the cnn job on three local hosts (network namespaces, each a real SSH server, launched through
# ssh, as in tests/launch/). Two failures:
#   node loss  every process of host 2 is SIGKILLed at step 25; mpirun notices at once, so the
#              recovery time is the whole cost (target: < 5 s); run twice, resuming from the
#              checkpoints on shared storage alone (every 10 steps, --snapshot-every-steps 0) and
#              from the snapshots in the hosts' memory (the default), with the steps redone and
#              the seconds of work they cost (target with snapshots: < 5 s);
#   cut        host 2's link goes down at step 25; the ranks' --step-timeout (5 s here) detects
#              it, hpcrun's --teardown-timeout (2 s) ends mpirun; printed: cut to detection,
#              detection to the first step (target: < 5 s plus the detection timeout).
# Each is repeated --runs times (default 3); the median and the spread are printed.
# Usage: sudo bench/hpcrun_recovery.sh [--runs N]   (root: it makes network namespaces and sshds)
# Environment: BUILD_DIR (default build), HPCRUN and HPCTRAIN (binaries).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
build_paths
runs=3
while (($#)); do
  case "$1" in
    --runs) [[ $# -ge 2 ]] || die "--runs needs a value"; runs=$2; shift 2 ;;
    -h | --help) sed -n '2,14s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) die "unknown option '$1'" ;;
  esac
done
require_count --runs "$runs"
[[ -x "$HPCRUN" && -x "$HPCTRAIN" ]] || die "build first (./setup.sh): $HPCRUN"
source "$root/tests/launch/common.sh"
netns_require
export EPOCHS=1 TRAIN_SAMPLES=24000

json_field() { json_number "$2" < "$NETNS_DIR/$1/hpcrun/summary.json"; }
median() { sort -n | awk '{ v[NR] = $1 } END { m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.2f s (min %.2f, max %.2f, %d runs)", m, v[1], v[NR], NR }'; }

loss=() cut_detect=() cut_recover=() redone_ck=() lost_ck=() redone_snap=() lost_snap=()
# Fresh hosts for every run, so that runs are independent (before the hosts had host names of
# their own, a reused one was seen to hang the next job at start).
fresh_hosts() {
  if [[ -n "${NETNS_ID:-}" ]]; then netns_cleanup; fi
  netns_setup 20 3
}
for ((i = 1; i <= runs; ++i)); do
  fresh_hosts
  TRAIN_EXTRA="--snapshot-every-steps 0" hpcrun_start "ckloss$i" -H "$(hpcrun_hosts "1 2 3")" -np 3 --min-np 2 \
    --blacklist-cooldown 10m:20m
  wait_for_step "ckloss$i" 25 120
  netns_kill_host 2
  hpcrun_wait 300
  [[ $RC == 0 ]] || fail "node-loss run $i (checkpoints alone) ended with $RC"
  redone_ck+=("$(json_field "ckloss$i" steps_redone)") lost_ck+=("$(json_field "ckloss$i" seconds_lost)")
  say "node loss, checkpoints alone, run $i: ${redone_ck[-1]} step(s) redone, ${lost_ck[-1]} s of work"

  fresh_hosts
  hpcrun_start "loss$i" -H "$(hpcrun_hosts "1 2 3")" -np 3 --min-np 2 --blacklist-cooldown 10m:20m
  wait_for_step "loss$i" 25 120
  netns_kill_host 2
  hpcrun_wait 300
  [[ $RC == 0 ]] || fail "node-loss run $i ended with $RC"
  loss+=("$(json_field "loss$i" recovery_seconds)")
  redone_snap+=("$(json_field "loss$i" steps_redone)") lost_snap+=("$(json_field "loss$i" seconds_lost)")
  say "node loss, run $i: ${loss[-1]} s from failure to the first step of the next attempt;" \
    "${redone_snap[-1]} step(s) redone, ${lost_snap[-1]} s of work"

  fresh_hosts
  STEP_TIMEOUT=5s hpcrun_start "cut$i" -H "$(hpcrun_hosts "1 2 3")" -np 3 --min-np 2 --blacklist-cooldown 10m:20m \
    --teardown-timeout 2s
  wait_for_step "cut$i" 25 120
  cut_at=$(date +%s.%N)
  netns_cut_host 2
  wait_for_text "cut$i" "attempt 1 failed" 60
  hpcrun_wait 300
  [[ $RC == 0 ]] || fail "cut run $i ended with $RC"
  # Attempt times in summary.json count from hpcrun's start, which it records on the wall clock.
  started=$(json_field "cut$i" started_unix)
  failed=$(json_field "cut$i" failed_at)
  recover=$(json_field "cut$i" recovery_seconds)
  cut_detect+=("$(awk -v s="$started" -v f="$failed" -v c="$cut_at" 'BEGIN { printf "%.2f", s + f - c }')")
  cut_recover+=("$recover")
  say "cut, run $i: failure handled ${cut_detect[-1]} s after the cut, then $recover s to the first step"
done

echo
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
echo "hpcrun recovery, cnn on Fashion-MNIST (${TRAIN_SAMPLES} samples), 3 namespace hosts over ssh on $(nproc) cores ($cpu):"
echo "  node loss: failure to first step of the next attempt: $(printf '%s\n' "${loss[@]}" | median)   target < 5 s"
echo "             work redone, checkpoints every 10 steps alone: $(printf '%s\n' "${redone_ck[@]}" | median | sed 's/ s / steps /;s/ s,/,/g')," \
  "$(printf '%s\n' "${lost_ck[@]}" | median)"
echo "             work redone, snapshots in host memory (auto):  $(printf '%s\n' "${redone_snap[@]}" | median | sed 's/ s / steps /;s/ s,/,/g')," \
  "$(printf '%s\n' "${lost_snap[@]}" | median)   target < 5 s"
echo "  link cut:  cut to detection: $(printf '%s\n' "${cut_detect[@]}" | median)" \
  "  (--step-timeout 5 s + --teardown-timeout 2 s)"
echo "             detection to first step: $(printf '%s\n' "${cut_recover[@]}" | median)   target < 5 s"

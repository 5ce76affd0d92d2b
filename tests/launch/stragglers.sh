#!/usr/bin/env bash
# A straggler: in a 4-host job (one rank each) host 2 turns slow but stays alive (its sshd, and so
# mpirun's daemon and the rank it starts there, are in a CPU cgroup whose quota drops to 5% of one
# CPU once the job runs: at 10% an ssh login alone takes 10 s, which the launch and the health
# probes would take for a dead host). It is named in the metrics as the slowest rank's host within
# a minute; hpcrun names it a straggler after --straggler-time and, with --drain-stragglers, drains
# it at a step boundary and keeps it out: the job continues and finishes on the other three.
source "$(dirname "$0")/common.sh"
netns_require

# The slow host's CPU quota: a cgroup v1 cpu group (or a v2 group with the cpu controller).
if [[ -w /sys/fs/cgroup/cpu/cgroup.procs && -e /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]]; then
  CG_ROOT=/sys/fs/cgroup/cpu
elif grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control 2> /dev/null && [[ -w /sys/fs/cgroup/cgroup.procs ]]; then
  CG_ROOT=/sys/fs/cgroup
else
  echo "SKIPPED: no writable CPU cgroup (cgroup v1 /sys/fs/cgroup/cpu, or v2 with the cpu controller) to slow a host"
  exit 77
fi
CG="$CG_ROOT/hpcrun-straggler-test"
cg_quota() {  # cg_quota PERCENT (of one CPU; "max": none)
  if [[ $CG_ROOT == /sys/fs/cgroup/cpu ]]; then
    local period
    period=$(cat "$CG/cpu.cfs_period_us")
    [[ $1 == max ]] && echo -1 > "$CG/cpu.cfs_quota_us" || echo $((period * $1 / 100)) > "$CG/cpu.cfs_quota_us"
  else
    [[ $1 == max ]] && echo "max 100000" > "$CG/cpu.max" || echo "$((1000 * $1)) 100000" > "$CG/cpu.max"
  fi
}
cg_remove() {
  [[ -d "$CG" ]] || return 0
  local pid i
  for ((i = 0; i < 50; ++i)); do
    while read -r pid; do echo "$pid" > "$CG_ROOT/cgroup.procs" 2> /dev/null || true; done < "$CG/cgroup.procs" 2> /dev/null
    rmdir "$CG" 2> /dev/null && return 0
    sleep 0.1
  done
  echo "warning: could not remove $CG" >&2
}
cg_remove  # a killed run's
mkdir "$CG" 2> /dev/null || { echo "SKIPPED: cannot create a cgroup under $CG_ROOT"; exit 77; }
trap cg_remove EXIT

netns_setup 18 4
trap 'netns_cleanup; cg_remove' EXIT
cat "$NETNS_DIR/ssh/h2/sshd.pid" > "$CG/cgroup.procs"
slow_name=hpt18h2  # host 2's own name (a UTS namespace), as the trainer sees it
say "host 2 (${NETNS_HOSTS[2]}, $slow_name): its sshd in $CG"

# A short job of small steps: 160 steps of 48 samples (12 per rank on 4 ranks, 16 on 3), no
# batch norm across ranks (its all-reduce in the forward pass would make the fast ranks wait
# inside their own work), checkpoints every 10 steps.
metrics="$NETNS_DIR/metrics.jsonl"
train_args() {
  echo --device cpu --threads 1 --data-dir "$FASHION_MNIST" --model cnn --global-batch-size 48 \
    --train-samples 7680 --test-samples 500 --epochs 1 --checkpoint-every-steps 10 --checkpoint-interval 0 \
    --step-timeout 60s --metrics-file "$metrics" --metrics-every-steps 5
}
hpcrun_start slow -H "$(hpcrun_hosts "1 2 3 4")" -np 4 --min-np 3 --blacklist-cooldown 10m:10m \
  --straggler-time 3s --drain-stragglers
wait_for_step slow 5 60
cg_quota 5
slowed=$SECONDS slowed_at=$(date +%s.%N)
say "host 2 slowed to 5% of one CPU at step $(step_of slow)"
wait_for_text slow "is a straggler" 60
say "named $((SECONDS - slowed)) s after the slow-down: $(grep -o "host .* is a straggler.*" "$NETNS_DIR/slow.err")"
wait_for_text slow "attempt 2:" 60
cg_quota max  # recovered: the end's clean-up reaches it at once
hpcrun_wait 120
[[ $RC == 0 ]] || fail "the job ended with $RC"
expect_in slow "attempt 1: 4 rank(s)"
expect_in slow "host ${NETNS_HOSTS[2]} ($slow_name) is a straggler: its rank 1's steps take "
expect_in slow "draining straggler host ${NETNS_HOSTS[2]}, kept out for 10 min"
expect_in slow "attempt 2: 3 rank(s) on ${NETNS_HOSTS[1]}:1,${NETNS_HOSTS[3]}:1,${NETNS_HOSTS[4]}:1"
expect_in slow "summary: 2 attempt(s), 0 failure(s), 1 host change(s)"
[[ -n "$(accuracy_of slow)" ]] || fail "the job printed no final accuracy"
# The metrics: a step event of attempt 1 within a minute of the slow-down names host 2 as the
# slowest rank's, more than 1.5 times the median; the run continued and finished on 3 ranks.
python3 - "$metrics" "$slowed_at" "$slow_name" << 'PY' || fail "the metrics did not show the straggler and the 3-rank finish"
import json, sys
path, started, slow = sys.argv[1], float(sys.argv[2]), sys.argv[3]
events = [json.loads(line) for line in open(path)]
configs = [e for e in events if e["event"] == "config"]
print("world sizes of the attempts:", [c["world_size"] for c in configs])
assert [c["world_size"] for c in configs] == [4, 3], configs
named = [e for e in events if e["event"] == "step" and e["unix_time"] >= started and e.get("slowest_host") == slow
         and e["straggler_ratio"] > 1.5]
assert named, "no step event names " + slow
first = named[0]
print("first named at step %d, %.1f s after the slow-down: rank %d on %s, ratio %.2f (busy %.3f s, median %.3f s)" % (
    first["step"], first["unix_time"] - started, first["slowest_rank"], first["slowest_host"],
    first["straggler_ratio"], first["slowest_busy_seconds"], first["median_busy_seconds"]))
assert first["unix_time"] - started <= 60, first
assert first["slowest_rank"] == 1, first
done = [e for e in events if e["event"] == "done"]
assert done and done[-1]["world_size"] == 3, done
PY
say "PASS"

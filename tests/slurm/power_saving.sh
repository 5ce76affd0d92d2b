#!/usr/bin/env bash
# Slurm's power saving with the AWS cluster's programs, end to end on this machine: a real
# slurmctld with the slurm.conf the head node renders calls resume.py when a job is queued, which
# launches a tagged instance in moto's EC2 (served on loopback) and registers it; a stand-in for
# the instance's boot starts that node's slurmd here; the job runs; after SuspendTime idle,
# slurmctld calls suspend.py, which terminates the instance, and the node powers down again.
# On the way: EC2 has no capacity for the first instance type, so resume.py disables it and
# launches the next; and the cluster manager (clustermgtd.py), run by hand as its timer would,
# terminates an orphan instance, returns a node the cluster set down to service and leaves an
# administrator's drained node alone while the job keeps running, changes nothing the second
# time, and once a drained node's job has ended powers it down and returns it to service. Last, a
# two-node job whose second node the account's quota refuses: the first node's instance is
# terminated too (slurmctld's SLURM_RESUME_FILE says they are one job's).
source "$(dirname "$0")/common.sh"
python3 -c 'import boto3, moto' 2> /dev/null || { echo "SKIPPED: python3 has no boto3 and moto"; exit 77; }
# fake_cloud.py serves EC2 with moto's ThreadedMotoServer: moto's server extra (Flask, not in moto[all]).
python3 -c 'import moto.server' 2> /dev/null ||
  { echo "SKIPPED: moto's server cannot start: install moto with its server extra, 'moto[all,server]>=5' (README)"; exit 77; }
slurm_setup 1 420
aws="$TEST_DIR/aws"
mkdir -p "$aws"/{state,spool,log,programs}
moto_port=$(free_port)
slurm_port=$(free_port_pair) || fail "no ports for slurmctld and slurmd"  # slurmd takes slurm_port + 1
# On a failure, what the cloud side did too: the power programs' calls and output, the watcher's
# slurmd starts, and this cluster's own daemons' logs.
FAIL_LOGS=("$aws/log/calls" "$aws/log/power.log" "$aws/log/nodes.log" "$aws/log/slurmctld.log" "$aws/log/slurmd.log")
endpoint="http://127.0.0.1:$moto_port"
export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing
marker="HPCTRAIN_SLURM_CLUSTER=$CLUSTER_DIR"  # local-cluster.sh down stops what carries it

env "$marker" python3 "$here/fake_cloud.py" server "$moto_port" p5.48xlarge "$aws/quota-refuses" > "$aws/log/moto.log" 2>&1 &
deadline=$((SECONDS + 30))
until python3 "$here/fake_cloud.py" setup "$endpoint" "$aws/cloud.json" "$aws/state" p5.48xlarge g5.xlarge 2> /dev/null; do
  ((SECONDS < deadline)) || fail "moto's server did not start"
  sleep 0.5
done

# The power-saving programs, as the head node installs them, behind wrappers that point them at
# moto and at this python3 (slurmctld runs them with its own environment).
for p in resume suspend resume_fail clustermgtd; do
  cat > "$aws/programs/$p.py" << WRAPPER
#!/bin/sh
export HPCTRAIN_CLOUD_CONFIG=$aws/cloud.json AWS_ENDPOINT_URL=$endpoint AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing
echo "\$(date +%s) $p \$*" >> $aws/log/calls
exec $(command -v python3) $repo/cloudformation/node/$p.py "\$@" >> $aws/log/power.log 2>&1
WRAPPER
  chmod +x "$aws/programs/$p.py"
done
python3 "$repo/cloudformation/node/render_slurm_conf.py" --cluster hpctrain-aws --controller localhost \
  --max-nodes 4 --cpus 1 --gpus 0 --memory-mib 1000 --suspend-minutes 1 --resume-timeout 300 \
  --programs "$aws/programs" --state-dir "$aws/state" --spool-dir "$aws/spool" --log-dir "$aws/log" \
  --port "$slurm_port" --munge-socket "$CLUSTER_DIR/munge/munge.socket" --epilog "$repo/slurm/epilog.sh" --out "$aws/etc" ||
  fail "render_slurm_conf.py failed"
# This machine stands in for the head node and the instance: loopback, root, no CPU binding; a
# node is suspended after 15 s idle, not a minute (the rendering's least), and powering down
# takes 20 s, not 2 minutes.
sed -i -e 's/^SlurmctldHost=localhost$/SlurmctldHost=localhost(127.0.0.1)/' -e 's/^SlurmUser=slurm$/SlurmUser=root/' \
  -e 's/^SuspendTime=.*/SuspendTime=15/' -e 's/^SuspendTimeout=.*/SuspendTimeout=20/' \
  -e 's|^TaskPlugin=.*|TaskPlugin=task/none|' \
  -e 's|^SelectTypeParameters=.*|SelectTypeParameters=CR_CPU|' -e 's|^SlurmdPidFile=.*|SlurmdPidFile='"$aws"'/slurmd.pid|' \
  "$aws/etc/slurm.conf"
echo "SlurmdParameters=config_overrides" >> "$aws/etc/slurm.conf"
export SLURM_CONF="$aws/etc/slurm.conf"
env "$marker" slurmctld -f "$SLURM_CONF" -i || fail "slurmctld refused the rendered slurm.conf"
env "$marker" python3 "$here/fake_cloud.py" nodes "$endpoint" "$SLURM_CONF" > "$aws/log/nodes.log" 2>&1 &
deadline=$((SECONDS + 30))
until scontrol ping 2> /dev/null | grep -q 'is UP'; do ((SECONDS < deadline)) || fail "slurmctld is not up"; sleep 0.3; done
say "nodes at rest: $(sinfo -h -N -o '%N %T' | tr '\n' ' ')"
[[ "$(sinfo -h -N -o '%T' | sort -u)" == "idle~" ]] || fail "the nodes are not powered down at the start"

instances() {  # the running instances in moto, as NODE:TYPE words
  python3 - "$endpoint" << 'PY'
import sys, boto3
c = boto3.client("ec2", region_name="us-east-1", endpoint_url=sys.argv[1])
for r in c.describe_instances(Filters=[{"Name": "instance-state-name", "Values": ["running"]}])["Reservations"]:
    for i in r["Instances"]:
        tags = {t["Key"]: t["Value"] for t in i.get("Tags", [])}
        print(f"{tags.get('hpctrain:node')}:{i['InstanceType']}")
PY
}
node_state() { sinfo -h -n "$1" -o '%T'; }
node_reason() { sinfo -h -n "$1" -o '%E'; }
manage() {  # one pass of the cluster manager, as its timer runs it; its log in $aws/log/manager.N
  local n=$(($(ls "$aws"/log/manager.* 2> /dev/null | wc -l) + 1))
  "$aws/programs/clustermgtd.py" || fail "clustermgtd.py failed: $(tail -n 3 "$aws/log/power.log")"
  sed -n "s/.*clustermgtd: INFO: //p" "$aws/log/power.log" | tail -n +"$((${MANAGED_LINES:-0} + 1))" > "$aws/log/manager.$n"
  MANAGED_LINES=$(grep -c "clustermgtd: INFO: " "$aws/log/power.log")
  sed 's/^/    clustermgtd: /' "$aws/log/manager.$n"
}
snapshot() { echo "$(sinfo -h -N -o '%N %T %E' | sort) $(instances | sort)"; }

job=$(sbatch --parsable -o "$WORK/job.out" -w gpu-1 --wrap "echo \"ran on \$SLURMD_NODENAME\"; while [ ! -e $WORK/release ]; do sleep 1; done")
submitted=$SECONDS
wait_state "$job" RUNNING 120
# RUNNING comes with the allocation; slurmd starts the batch script (and makes its output file) a
# moment later: a CI run read job.out before it existed.
deadline=$((SECONDS + 30))
until grep -q "ran on" "$WORK/job.out" 2> /dev/null; do
  ((SECONDS < deadline)) || fail "job $job is RUNNING but its script printed nothing in 30 s"
  sleep 0.5
done
say "the job runs $((SECONDS - submitted)) s after submission: $(cat "$WORK/job.out")"
grep -q "resume gpu-1" "$aws/log/calls" || fail "slurmctld did not call resume.py for gpu-1"
grep -q "ran on gpu-1" "$WORK/job.out" || fail "the job did not run on gpu-1"
# No p5.48xlarge capacity: that choice is disabled for a while and the next type is launched.
grep -q "p5.48xlarge|on-demand|.* launch failed: InsufficientInstanceCapacity" "$aws/log/power.log" ||
  fail "resume.py did not try p5.48xlarge first"
grep -q '"p5.48xlarge|on-demand|' "$aws/state/cloud-state.json" || fail "p5.48xlarge is not cooling down"
[[ "$(instances)" == "gpu-1:g5.xlarge" ]] || fail "running instances: '$(instances)', not gpu-1's g5.xlarge"

# What the cluster manager is for: an instance no node owns, a node the cluster set down, and
# one an administrator drained.
orphan=$(python3 "$here/fake_cloud.py" launch "$endpoint" gpu-4)
scontrol update nodename=gpu-2 state=down reason="hpctrain: resume failed: InsufficientInstanceCapacity: none"
scontrol update nodename=gpu-3 state=drain reason="new disks (admin)"
say "before the cluster manager: $(sinfo -h -N -o '%N %T' | tr '\n' ' ')$(instances | tr '\n' ' ')"
manage
[[ "$(instances)" == "gpu-1:g5.xlarge" ]] || fail "after the manager: '$(instances)', not only gpu-1's (orphan $orphan)"
grep -q "gpu-4: terminated orphan $orphan" "$aws/log/manager.1" || fail "the manager did not say it terminated $orphan"
[[ "$(node_state gpu-2)" == "idle~" ]] || fail "gpu-2 is $(node_state gpu-2), not returned to service (idle~)"
[[ "$(node_state gpu-3)" == "drained~" && "$(node_reason gpu-3)" == "new disks (admin)" ]] ||
  fail "the administrator's drained gpu-3 is $(node_state gpu-3) ($(node_reason gpu-3))"
[[ "$(job_field "$job" JobState)" == RUNNING && "$(node_state gpu-1)" == allocated ]] ||
  fail "the job is $(job_field "$job" JobState) on a $(node_state gpu-1) gpu-1 after the manager"
[[ -s "$aws/state/heartbeat" ]] || fail "the manager wrote no heartbeat"
before=$(snapshot)
manage
[[ "$(snapshot)" == "$before" ]] || fail "the second pass changed something: '$before' -> '$(snapshot)'"
grep -q "^nothing to do" "$aws/log/manager.2" || fail "the second pass did something: $(cat "$aws/log/manager.2")"

# A spot rebalance recommendation drains gpu-1 (as spot_watcher.py does): the job runs on; once
# it has ended, the manager powers the node down (its instance terminated) and returns it.
scontrol update nodename=gpu-1 state=drain reason="hpctrain: spot rebalance recommendation"
manage
[[ "$(job_field "$job" JobState)" == RUNNING && "$(instances)" == "gpu-1:g5.xlarge" ]] ||
  fail "draining gpu-1: the job is $(job_field "$job" JobState), instances '$(instances)'"
touch "$WORK/release"
wait_state "$job" COMPLETED 60
manage
grep -q "gpu-1: power_down_force" "$aws/log/manager.4" || fail "the manager did not power down the drained gpu-1"
deadline=$((SECONDS + 90))
until [[ -z "$(instances)" && "$(node_state gpu-1)" == "idle~" ]]; do
  ((SECONDS < deadline)) || fail "gpu-1 is $(node_state gpu-1) ($(node_reason gpu-1)), instances '$(instances)', 90 s after its power-down"
  sleep 1
  [[ "$(node_state gpu-1)" =~ ^(drained|down)~$ ]] && manage  # not cleared by the power-down: the manager's
done
say "the drained gpu-1 is powered down and back in service: $(sinfo -h -n gpu-1 -o '%T %E')"

# Scale from zero again (no p5.48xlarge try while it cools down), and back to zero after
# SuspendTime (15 s here) idle.
job=$(sbatch --parsable -o "$WORK/job2.out" -w gpu-1 --wrap 'echo "ran on $SLURMD_NODENAME"')
submitted=$SECONDS
wait_state "$job" COMPLETED 120
say "the job ran $((SECONDS - submitted)) s after submission: $(cat "$WORK/job2.out")"
[[ "$(grep -c 'p5.48xlarge|on-demand|.* launch failed' "$aws/log/power.log")" == 1 ]] ||
  fail "resume.py tried p5.48xlarge again while it was cooling down"
[[ "$(instances)" == "gpu-1:g5.xlarge" ]] || fail "running instances: '$(instances)', not gpu-1's"

idle_from=$SECONDS
deadline=$((SECONDS + 180))
until grep -q "suspend gpu-1" <(tail -n 1 "$aws/log/calls") 2> /dev/null && [[ -z "$(instances)" ]]; do
  ((SECONDS < deadline)) || fail "gpu-1 was not suspended within 180 s of idling (SuspendTime 15 s)"
  sleep 1
done
say "suspend.py terminated gpu-1's instance $((SECONDS - idle_from)) s after the job ended"
# Slurm shows it powering down (idle%) until SuspendTimeout has passed, then powered down
# (idle~); either way no instance is left.
state=$(node_state gpu-1)
[[ "$state" == "idle%" || "$state" == "idle~" ]] || fail "gpu-1 is $state after suspend, not powering or powered down"

# All or nothing: a two-node job on an account whose vCPU quota is spent by the time gpu-4's
# launch comes. slurmctld's job-to-node map (SLURM_RESUME_FILE) tells resume.py that gpu-2 is for
# the same job, so gpu-2's instance does not stay up, billed, for a job that cannot start.
echo gpu-4 > "$aws/quota-refuses"
lines=$(wc -l < "$aws/log/power.log")
job=$(sbatch --parsable -o "$WORK/job3.out" -N 2 -w gpu-2,gpu-4 --wrap 'echo "ran on $SLURM_JOB_NODELIST"')
deadline=$((SECONDS + 60))
until [[ "$(node_state gpu-2)" == down* && "$(node_state gpu-4)" == down* ]]; do
  ((SECONDS < deadline)) || fail "gpu-2 is $(node_state gpu-2) ($(node_reason gpu-2)), gpu-4 $(node_state gpu-4) ($(node_reason gpu-4)) 60 s after the two-node job's submission"
  sleep 0.5
done
tail -n +"$((lines + 1))" "$aws/log/power.log" | sed 's/^/    resume: /'
! tail -n +"$((lines + 1))" "$aws/log/power.log" | grep -q "SLURM_RESUME_FILE" ||
  fail "resume.py did not understand slurmctld's SLURM_RESUME_FILE"
[[ "$(node_reason gpu-4)" == "hpctrain: resume failed: VcpuLimitExceeded: "* ]] ||
  fail "gpu-4's reason is '$(node_reason gpu-4)', not the quota's"
[[ "$(node_reason gpu-2)" == "hpctrain: resume failed: its job cannot start (job $job: gpu-4 got no instance)" ]] ||
  fail "gpu-2's reason is '$(node_reason gpu-2)', not its job's"
[[ -z "$(instances)" ]] || fail "instances left running for a job that cannot start: '$(instances)'"
say "the two-node job without quota for gpu-4 left no instance: job $job is $(job_field "$job" JobState) ($(job_field "$job" Reason))"
[[ ! -s "$WORK/job3.out" ]] || fail "the two-node job ran: $(cat "$WORK/job3.out")"
scancel "$job"
cat "$aws/log/calls" | sed 's/^/    calls: /'
say "PASS: scaled from zero and back twice; the cluster manager cleaned up and changed nothing the second time; a job that could not get all its nodes kept none"

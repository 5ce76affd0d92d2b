#!/usr/bin/env bash
# Slurm's power saving with the AWS cluster's programs, end to end on this machine: a real
# slurmctld with the slurm.conf the head node renders calls resume.py when a job is queued, which
# launches a tagged instance in moto's EC2 (served on loopback) and registers it; a stand-in for
# the instance's boot starts that node's slurmd here; the job runs; after SuspendTime idle,
# slurmctld calls suspend.py, which terminates the instance, and the node powers down again.
source "$(dirname "$0")/common.sh"
python3 -c 'import boto3, moto' 2> /dev/null || { echo "SKIPPED: python3 has no boto3 and moto"; exit 77; }
slurm_setup 1 300
aws="$TEST_DIR/aws"
mkdir -p "$aws"/{state,spool,log,programs}
moto_port=$(free_port)
slurm_port=$(free_port)
endpoint="http://127.0.0.1:$moto_port"
export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing
marker="HPCTRAIN_SLURM_CLUSTER=$CLUSTER_DIR"  # local-cluster.sh down stops what carries it

env "$marker" python3 "$here/fake_cloud.py" server "$moto_port" > "$aws/log/moto.log" 2>&1 &
deadline=$((SECONDS + 30))
until python3 "$here/fake_cloud.py" setup "$endpoint" "$aws/cloud.json" 2> /dev/null; do
  ((SECONDS < deadline)) || fail "moto's server did not start"
  sleep 0.5
done

# The power-saving programs, as the head node installs them, behind wrappers that point them at
# moto and at this python3 (slurmctld runs them with its own environment).
for p in resume suspend resume_fail; do
  cat > "$aws/programs/$p.py" << WRAPPER
#!/bin/sh
export HPCTRAIN_CLOUD_CONFIG=$aws/cloud.json AWS_ENDPOINT_URL=$endpoint AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing
echo "\$(date +%s) $p \$*" >> $aws/log/calls
exec $(command -v python3) $repo/cloudformation/node/$p.py "\$@" >> $aws/log/power.log 2>&1
WRAPPER
  chmod +x "$aws/programs/$p.py"
done
python3 "$repo/cloudformation/node/render_slurm_conf.py" --cluster hpctrain-aws --controller localhost \
  --max-nodes 1 --cpus 1 --gpus 0 --memory-mib 1000 --suspend-minutes 1 --resume-timeout 300 \
  --programs "$aws/programs" --state-dir "$aws/state" --spool-dir "$aws/spool" --log-dir "$aws/log" \
  --port "$slurm_port" --munge-socket "$CLUSTER_DIR/munge/munge.socket" --out "$aws/etc" ||
  fail "render_slurm_conf.py failed"
# This machine stands in for the head node and the instance: loopback, root, no CPU binding.
sed -i -e 's/^SlurmctldHost=localhost$/SlurmctldHost=localhost(127.0.0.1)/' -e 's/^SlurmUser=slurm$/SlurmUser=root/' \
  -e 's|^TaskPlugin=.*|TaskPlugin=task/none|' \
  -e 's|^SelectTypeParameters=.*|SelectTypeParameters=CR_CPU|' -e 's|^SlurmdPidFile=.*|SlurmdPidFile='"$aws"'/slurmd.pid|' \
  "$aws/etc/slurm.conf"
echo "SlurmdParameters=config_overrides" >> "$aws/etc/slurm.conf"
export SLURM_CONF="$aws/etc/slurm.conf"
env "$marker" slurmctld -f "$SLURM_CONF" -i || fail "slurmctld refused the rendered slurm.conf"
env "$marker" python3 "$here/fake_cloud.py" nodes "$endpoint" "$SLURM_CONF" > "$aws/log/nodes.log" 2>&1 &
deadline=$((SECONDS + 30))
until scontrol ping 2> /dev/null | grep -q 'is UP'; do ((SECONDS < deadline)) || fail "slurmctld is not up"; sleep 0.3; done
say "nodes at rest: $(sinfo -h -N -o '%N %T')"
[[ "$(sinfo -h -N -o '%T')" == "idle~" ]] || fail "gpu-1 is not powered down at the start"

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

job=$(sbatch --parsable -o "$WORK/job.out" --wrap 'echo "ran on $SLURMD_NODENAME"')
submitted=$SECONDS
wait_state "$job" COMPLETED 120
say "the job ran $((SECONDS - submitted)) s after submission: $(cat "$WORK/job.out")"
grep -q "resume gpu-1" "$aws/log/calls" || fail "slurmctld did not call resume.py for gpu-1"
[[ "$(instances)" == "gpu-1:g5.xlarge" ]] || fail "running instances: '$(instances)', not gpu-1's"
grep -q "ran on gpu-1" "$WORK/job.out" || fail "the job did not run on gpu-1"

idle_from=$SECONDS
deadline=$((SECONDS + 180))
until grep -q "suspend gpu-1" "$aws/log/calls" 2> /dev/null && [[ -z "$(instances)" ]]; do
  ((SECONDS < deadline)) || fail "gpu-1 was not suspended within 180 s of idling (SuspendTime 60 s)"
  sleep 1
done
say "suspend.py terminated gpu-1's instance $((SECONDS - idle_from)) s after the job ended"
# Slurm shows it powering down (idle%) until SuspendTimeout (120 s) has passed, then powered down
# (idle~); either way no instance is left.
state=$(sinfo -h -N -o '%T')
[[ "$state" == "idle%" || "$state" == "idle~" ]] || fail "gpu-1 is $state after suspend, not powering or powered down"
cat "$aws/log/calls" | sed 's/^/    calls: /'
say "PASS: scaled from zero to one instance and back"

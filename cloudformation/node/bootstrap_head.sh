#!/usr/bin/env bash
# The head node's bootstrap, run as root by cfn-init (cluster.yaml) once /shared (EFS) is mounted
# and hpctrain is cloned to /shared/hpctrain; a failure here fails the stack through cfn-signal.
# Settings come from /etc/hpctrain/cluster.env and /etc/hpctrain/cloud.json (written by cfn-init).
#
#   1. munge: the key is made once, at the first boot, in /shared/.hpctrain (mode 0400, root's,
#      on storage only the cluster's security groups reach) and installed from there by every node;
#   2. Slurm: slurm.conf and gres.conf rendered by render_slurm_conf.py (compute nodes as CLOUD
#      nodes powered by resume.py/suspend.py), copied to /shared/.hpctrain/etc for the compute
#      nodes, slurmctld enabled;
#   3. hpctrain built (CPU) into /shared/hpctrain/build; the compute nodes build the CUDA one;
#   4. the CloudWatch agent ships Slurm's and these programs' logs to the stack's log group.
set -euo pipefail
# shellcheck source=/dev/null
. /etc/hpctrain/cluster.env
export DEBIAN_FRONTEND=noninteractive
node_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

apt-get install -y -q slurmctld slurm-client munge python3-boto3 curl

install -d -m 0700 /shared/.hpctrain
if [[ ! -s /shared/.hpctrain/munge.key ]]; then
  (umask 077 && head -c 1024 /dev/urandom > /shared/.hpctrain/munge.key.tmp && mv /shared/.hpctrain/munge.key.tmp /shared/.hpctrain/munge.key)
fi
install -m 0400 -o munge -g munge /shared/.hpctrain/munge.key /etc/munge/munge.key
systemctl enable munge && systemctl restart munge

install -d /opt/hpctrain/cloud
install -m 0755 "$node_dir"/*.py /opt/hpctrain/cloud/
install -d -o slurm -g slurm /var/spool/slurmctld /var/log/slurm /var/log/hpctrain
python3 /opt/hpctrain/cloud/render_slurm_conf.py --cluster "$CLUSTER_NAME" --controller "$(hostname -s)" \
  --max-nodes "$MAX_NODES" --cpus "$CPUS" --gpus "$GPUS" --memory-mib "$MEMORY_MIB" \
  --suspend-minutes "$SUSPEND_MINUTES" --resume-timeout "$RESUME_TIMEOUT" --programs /opt/hpctrain/cloud \
  --out /etc/slurm
install -d -m 0755 /shared/.hpctrain/etc
install -m 0644 /etc/slurm/slurm.conf /etc/slurm/gres.conf /shared/.hpctrain/etc/
systemctl enable slurmctld && systemctl restart slurmctld

# Jobs find the CUDA build the compute nodes make (train.sbatch reads HPCTRAIN).
cat > /etc/profile.d/hpctrain.sh << 'PROFILE'
export HPCTRAIN=/shared/hpctrain/build-cuda/src/hpctrain HPCRUN=/shared/hpctrain/build-cuda/launch/hpcrun
PROFILE
BUILD_DIR=/shared/hpctrain/build /shared/hpctrain/setup.sh

# Logs to CloudWatch.
curl -fsSL -o /tmp/cwagent.deb https://s3.amazonaws.com/amazoncloudwatch-agent/ubuntu/amd64/latest/amazon-cloudwatch-agent.deb
dpkg -i /tmp/cwagent.deb
cat > /opt/aws/amazon-cloudwatch-agent/etc/amazon-cloudwatch-agent.json << JSON
{"logs": {"logs_collected": {"files": {"collect_list": [
  {"file_path": "/var/log/slurm/slurmctld.log", "log_group_name": "$LOG_GROUP", "log_stream_name": "{instance_id}/slurmctld"},
  {"file_path": "/var/log/hpctrain/power.log", "log_group_name": "$LOG_GROUP", "log_stream_name": "{instance_id}/power"},
  {"file_path": "/var/log/cfn-init.log", "log_group_name": "$LOG_GROUP", "log_stream_name": "{instance_id}/bootstrap"}
]}}}}
JSON
/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl -a fetch-config -m ec2 -s \
  -c file:/opt/aws/amazon-cloudwatch-agent/etc/amazon-cloudwatch-agent.json
echo "hpctrain head node ready: $(sinfo -h -o '%D nodes %P')"

#!/usr/bin/env bash
# The head node's bootstrap, run as root by cfn-init (cluster.yaml) from /opt/hpctrain/src, where
# cfn-init has installed hpctrain at the pinned revision (root's, on this node's own disk); a
# failure here fails the stack through cfn-signal. Settings: /etc/hpctrain/cluster.env and
# /etc/hpctrain/cloud.json (written by cfn-init; the former's values single-quoted).
#
#   1. the instance metadata service (and so this node's role) for root and Slurm's user only;
#   2. /shared (EFS) mounted: data and checkpoints only, nothing that root runs or trusts;
#   3. munge: the key the stack generated, from Secrets Manager, served to the compute nodes
#      (whose role may not read it) by a root-only NFS export;
#   4. Slurm: slurm.conf and gres.conf rendered by render_slurm_conf.py (compute nodes as CLOUD
#      nodes powered by resume.py/suspend.py, which run from /opt/hpctrain/src), served to the
#      compute nodes by slurmctld itself (configless), slurmctld enabled: apply_head_settings.sh,
#      which cfn-hup runs again when a stack update changes the settings;
#   5. the cluster manager (clustermgtd.py) on a one-minute systemd timer, as Slurm's user;
#   6. hpctrain built (CPU) in /opt/hpctrain/src/build; each compute node builds its CUDA one at
#      the same path, so that slurm/train.sbatch finds it there on every node;
#   7. the CloudWatch agent ships Slurm's and these programs' logs to the stack's log group;
#   8. EC2 asked (dry runs) whether this node may launch every instance choice resume.py would
#      try: a refused permission fails the stack here, not each job's power-up later.
set -euo pipefail
# shellcheck source=/dev/null
. /etc/hpctrain/cluster.env
export DEBIAN_FRONTEND=noninteractive
node_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

apt-get install -y -q slurmctld slurm-client munge python3-boto3 curl gpg nfs-common nfs-kernel-server nftables

# 1. The metadata service hands out this node's credentials (which may launch and terminate
# instances) to whoever asks: root and Slurm's user (the power-saving programs and the cluster
# manager run as it) only, from now and early on every boot (imds_firewall.sh). The launch
# already limits it to one hop (no container reaches it).
bash "$node_dir/imds_firewall.sh" head

# 2. /shared.
EFS_ID="$EFS_ID" bash "$node_dir/mount_shared.sh"  # TLS and IAM authorisation (efs-utils)
chmod 1777 /shared
install -d -o slurm -g slurm -m 0755 /shared/.hpctrain  # the cluster manager's heartbeat

# 3. munge: the key from Secrets Manager (only this node's role may read it), served to the
# compute nodes by a root-only NFS export to their subnets (export_munge_key.py).
python3 "$node_dir/fetch_munge_key.py" --secret "$MUNGE_SECRET" --region "$REGION"
systemctl enable munge && systemctl restart munge
systemctl enable --now nfs-server
python3 "$node_dir/export_munge_key.py"

# 4. Slurm.
install -d -o slurm -g slurm /var/spool/slurmctld /var/log/slurm /var/log/hpctrain /var/lib/hpctrain
# The power log, Slurm's user's before any program writes it: launch_check.py (root, step 8 and
# each update) would otherwise make it root's whenever it came first, and resume.py, suspend.py
# and the cluster manager (Slurm's user) could then not open it: their lines would reach no log group.
[[ -e /var/log/hpctrain/power.log ]] || install -o slurm -g slurm -m 0644 /dev/null /var/log/hpctrain/power.log
"$node_dir/apply_head_settings.sh"  # again by cfn-hup after each update of the settings

# 5. The cluster manager. A pass holds the state file's lock that resume.py and suspend.py wait
# for: one that hangs (on EC2, say; each Slurm command has its own bound) is killed after 5 minutes
# rather than stop every power-up, and the timer starts the next.
cat > /etc/systemd/system/hpctrain-clustermgtd.service << UNIT
[Unit]
Description=hpctrain cluster manager: one pass (orphans, nodes back to service, heartbeat)
After=slurmctld.service
[Service]
Type=oneshot
TimeoutStartSec=5min
User=slurm
ExecStart=/usr/bin/python3 $node_dir/clustermgtd.py
UNIT
cat > /etc/systemd/system/hpctrain-clustermgtd.timer << 'UNIT'
[Unit]
Description=hpctrain cluster manager, every minute
[Timer]
OnBootSec=1min
OnUnitInactiveSec=1min
[Install]
WantedBy=timers.target
UNIT
systemctl daemon-reload
systemctl enable --now hpctrain-clustermgtd.timer

# 6. hpctrain (CPU) for jobs' steps on this node; the compute nodes build theirs.
/opt/hpctrain/src/setup.sh

# 7. Logs to CloudWatch.
"$node_dir/install_cloudwatch_agent.sh" debian  # its signature checked against AWS's key
cat > /opt/aws/amazon-cloudwatch-agent/etc/amazon-cloudwatch-agent.json << JSON
{"logs": {"logs_collected": {"files": {"collect_list": [
  {"file_path": "/var/log/slurm/slurmctld.log", "log_group_name": "$LOG_GROUP", "log_stream_name": "{instance_id}/slurmctld"},
  {"file_path": "/var/log/hpctrain/power.log", "log_group_name": "$LOG_GROUP", "log_stream_name": "{instance_id}/power"},
  {"file_path": "/var/log/cfn-init.log", "log_group_name": "$LOG_GROUP", "log_stream_name": "{instance_id}/bootstrap"}
]}}}}
JSON
/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl -a fetch-config -m ec2 -s \
  -c file:/opt/aws/amazon-cloudwatch-agent/etc/amazon-cloudwatch-agent.json
# 8. The launches, dry: after the logs, so that a refusal's lines reach the log group.
python3 "$node_dir/launch_check.py"

echo "hpctrain head node ready: $(sinfo -h -o '%D nodes %P')"

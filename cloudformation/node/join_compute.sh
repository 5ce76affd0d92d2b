#!/usr/bin/env bash
# A compute instance's bootstrap, run as root by its user data from /opt/hpctrain/src (hpctrain
# at the pinned revision on this node's own disk, root's; nothing here comes from /shared).
# Settings: /etc/hpctrain/cluster.env (written by the user data, values single-quoted). It
# learns which Slurm node it stands for and where slurmctld is from its own tags (instance
# metadata, IMDSv2), mounts /shared (data and checkpoints), installs the munge key from the head
# node, starts the spot watcher and the watchdog, installs the packages and the CUDA hpctrain
# unless the compute image has them (prepare_compute.sh), and starts slurmd, which takes its
# configuration from slurmctld (configless). slurmctld then sees the node register and starts its job.
set -euo pipefail
# shellcheck source=/dev/null
. /etc/hpctrain/cluster.env
export DEBIAN_FRONTEND=noninteractive
node_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# First, before anything else runs and long before slurmd: the metadata service (this node's role
# credentials) for root only (this script, the spot watcher and the watchdog), from now and early
# on every boot, and slurmd made to require it (imds_firewall.sh). No job may read the role.
bash "$node_dir/imds_firewall.sh" compute
# And no job takes root, which the firewall lets through: the image's accounts of the uids jobs run
# as (the Deep Learning AMI's ubuntu has uid 1000, as the head node's admin) lose passwordless sudo
# and the docker, lxd, sudo and adm groups (unprivileged_users.sh).
bash "$node_dir/unprivileged_users.sh"

imds=http://169.254.169.254/latest
# The metadata service answers in milliseconds: one that does not (stalled, or unreachable) fails
# the boot at once, with a line naming what it asked (the user data's ERR trap then shuts the node
# down, and the cluster manager sets its node down), rather than hold it until ResumeTimeout.
# Each request: 2 s to connect, 5 s in all, 3 retries 1, 2 and 4 s apart: 27 s at most, 81 s for the three.
imds_get() {  # imds_get [CURL OPTION...] URL
  curl -fsS --connect-timeout 2 --max-time 5 --retry 3 "$@" ||
    { echo "join_compute.sh: error: no answer from the instance metadata service for ${*: -1}" >&2; return 1; }
}
token=$(imds_get -X PUT -H "X-aws-ec2-metadata-token-ttl-seconds: 300" "$imds/api/token")
tag() { imds_get -H "X-aws-ec2-metadata-token: $token" "$imds/meta-data/tags/instance/$1"; }
node=$(tag hpctrain:node)
controller=$(tag hpctrain:controller)
[[ "$node" =~ ^[a-z][a-z0-9-]{0,30}$ ]] || { echo "join_compute.sh: error: bad hpctrain:node tag '$node'" >&2; exit 1; }
[[ "$controller" =~ ^[A-Za-z0-9.-]+$ ]] || { echo "join_compute.sh: error: bad hpctrain:controller tag '$controller'" >&2; exit 1; }
echo "$node" > /etc/hpctrain/node-name

EFS_ID="$EFS_ID" bash "$node_dir/mount_shared.sh"  # TLS and IAM authorisation (efs-utils)

# The munge key from the head node (export_munge_key.py: a read-only export of a root-only
# directory to the compute subnets, mountable only from a privileged port): this node's role may
# not read it from Secrets Manager, so that credentials taken from a compute node forge nothing.
keys=$(mktemp -d)
for _ in $(seq 30); do
  mount -t nfs4 -o ro,nfsvers=4.1,timeo=50,retrans=2 "$controller:/etc/hpctrain/keys" "$keys" && break
  sleep 10
done
mountpoint -q "$keys" || { echo "join_compute.sh: error: cannot mount $controller:/etc/hpctrain/keys (the munge key)" >&2; exit 1; }
install -m 0400 -o munge -g munge "$keys/munge.key" /etc/munge/munge.key
umount "$keys" && rmdir "$keys"
systemctl enable munge && systemctl restart munge

# Both services run scontrol. This node has no slurm.conf (configless): slurmd keeps the one it
# fetches in SlurmdSpoolDir/conf-cache (render_slurm_conf.py: /var/spool/slurmd). Slurm 22.05's
# commands find it through /run/slurm/conf, but the Deep Learning AMI's 21.08 looks only at
# SLURM_CONF and /etc/slurm: without this, every scontrol of the spot watcher (the drain before a
# reclaim) and of the watchdog would fail there.
# Both restarted after any failure, for the instance's life: 5 s apart and with no start limit
# (systemd's default gives up for good after 5 starts in 10 s, and a node without its watchdog
# or its spot watcher is never terminated when the head is gone, or loses its jobs' checkpoints).
slurm_conf=/var/spool/slurmd/conf-cache/slurm.conf
cat > /etc/systemd/system/hpctrain-spot-watcher.service << UNIT
[Unit]
Description=hpctrain spot interruption watcher (drains the node, jobs checkpoint)
After=slurmd.service
StartLimitIntervalSec=0
[Service]
Environment=SLURM_CONF=$slurm_conf
ExecStart=/usr/bin/python3 $node_dir/spot_watcher.py --node $node
Restart=always
RestartSec=5
[Install]
WantedBy=multi-user.target
UNIT
cat > /etc/systemd/system/hpctrain-computemgtd.service << UNIT
[Unit]
Description=hpctrain watchdog: this instance terminates itself when the head node is gone (no heartbeat, and Slurm has it down or is unreachable)
After=network-online.target remote-fs.target
StartLimitIntervalSec=0
[Service]
Environment=SLURM_CONF=$slurm_conf
ExecStart=/usr/bin/python3 $node_dir/computemgtd.py --node $node --stale-after $((HEARTBEAT_MINUTES * 60))
Restart=always
RestartSec=5
[Install]
WantedBy=multi-user.target
UNIT
systemctl daemon-reload
systemctl enable --now hpctrain-computemgtd hpctrain-spot-watcher
# Jobs' credentials for the data bucket (the data role's, never this node's: data_credentials.py).
if [[ -n "${DATA_ROLE:-}" ]]; then
  install -m 0644 "$node_dir/systemd/hpctrain-data-credentials.service" /etc/systemd/system/
  systemctl daemon-reload && systemctl enable --now hpctrain-data-credentials
fi

# The packages and the CUDA hpctrain: on the compute image made for this revision (its marker,
# /opt/hpctrain/image.json, names it) nothing to do; on any other image, installed and built now,
# on billed time (prepare_compute.sh, which the image's build runs too).
bash "$node_dir/prepare_compute.sh" --if-needed "$REVISION"

# slurmd with its configuration from slurmctld (no slurm.conf here: the packaged unit's
# condition on one is lifted), on every boot only once /shared is mounted.
install -d -o slurm -g slurm /var/spool/slurmd /var/log/slurm
install -d /etc/systemd/system/slurmd.service.d
printf '[Unit]\nConditionPathExists=\n' > /etc/systemd/system/slurmd.service.d/configless.conf
install -m 0644 "$node_dir/systemd/slurmd-shared.conf" /etc/systemd/system/slurmd.service.d/shared.conf
echo "SLURMD_OPTIONS=\"-N $node --conf-server $controller\"" > /etc/default/slurmd
systemctl daemon-reload
systemctl enable slurmd && systemctl restart slurmd

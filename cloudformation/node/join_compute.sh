#!/usr/bin/env bash
# A compute instance's bootstrap (its user data runs it once /shared is mounted): it learns which
# Slurm node it stands for from its own hpctrain:node tag (instance metadata, IMDSv2), installs
# the cluster's munge key and slurm.conf from /shared/.hpctrain, starts slurmd as that node and
# the spot watcher, and builds the CUDA hpctrain into /shared/hpctrain/build-cuda the first time
# (one node at a time, under a lock). slurmctld then sees the node register and starts its job.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
imds=http://169.254.169.254/latest
token=$(curl -fsS -X PUT "$imds/api/token" -H "X-aws-ec2-metadata-token-ttl-seconds: 300")
node=$(curl -fsS -H "X-aws-ec2-metadata-token: $token" "$imds/meta-data/tags/instance/hpctrain:node")
[[ -n "$node" ]] || { echo "join_compute.sh: error: this instance has no hpctrain:node tag" >&2; exit 1; }
install -d /etc/hpctrain
echo "$node" > /etc/hpctrain/node-name

install -m 0400 -o munge -g munge /shared/.hpctrain/munge.key /etc/munge/munge.key
systemctl enable munge && systemctl restart munge
install -m 0644 /shared/.hpctrain/etc/slurm.conf /shared/.hpctrain/etc/gres.conf /etc/slurm/
install -d -o slurm -g slurm /var/spool/slurmd /var/log/slurm
echo "SLURMD_OPTIONS=\"-N $node\"" > /etc/default/slurmd

cat > /etc/systemd/system/hpctrain-spot-watcher.service << UNIT
[Unit]
Description=hpctrain spot interruption watcher (drains the node, jobs checkpoint)
After=slurmd.service
[Service]
ExecStart=/usr/bin/python3 /shared/hpctrain/cloudformation/node/spot_watcher.py --node $node
Restart=always
[Install]
WantedBy=multi-user.target
UNIT
systemctl daemon-reload
systemctl enable --now hpctrain-spot-watcher

# Packages, and the CUDA build the first time: one node at a time (the others find it built).
# GPU support is required (a build that quietly went CPU-only would train on the CPU), and no
# -march=native: the build is shared by every node, whatever instance type they come up as.
flock /shared/.hpctrain/build.lock env BUILD_DIR=/shared/hpctrain/build-cuda \
  CMAKE_ARGS="-DHPCTRAIN_CUDA=ON -DHPCTRAIN_CUDNN=ON -DHPCTRAIN_NCCL=ON -DHPCTRAIN_NATIVE=OFF" \
  /shared/hpctrain/setup.sh
systemctl enable slurmd && systemctl restart slurmd

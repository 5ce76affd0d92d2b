#!/usr/bin/env bash
# Mounts the cluster's EFS file system at /shared, now and at every boot, with TLS and IAM
# authorisation (efs-utils: `mount -t efs -o tls,iam`): the file system's policy (cluster.yaml,
# FileSystemPolicy) refuses any client without TLS, and any but the head node's and the compute
# nodes' roles; root is squashed except on the head node. Run as root by bootstrap_head.sh and
# join_compute.sh, with EFS_ID from /etc/hpctrain/cluster.env. FSTAB, SHARED, MOUNT_TRIES and
# MOUNT_PAUSE are for the tests only.
set -euo pipefail
fstab=${FSTAB:-/etc/fstab}
shared=${SHARED:-/shared}
: "${EFS_ID:?}"

"$(dirname "${BASH_SOURCE[0]}")/install_efs_utils.sh"  # (nothing to do on a compute image)
# (efs-utils finds the region and this node's credentials in the instance metadata, as root.)
mkdir -p "$shared"
grep -q " $shared " "$fstab" ||
  echo "$EFS_ID:/ $shared efs _netdev,tls,iam 0 0" >> "$fstab"
# A new mount target takes a minute or two to answer: tried for 10 minutes, then an error, which
# fails the head node's bootstrap (and with it the stack, with this line in cfn-init's log) or
# shuts a compute node down, rather than wait there until the stack's or Slurm's timeout.
tries=${MOUNT_TRIES:-120} pause=${MOUNT_PAUSE:-5}
until mountpoint -q "$shared" || mount "$shared"; do
  if ((--tries <= 0)); then
    echo "mount_shared.sh: error: cannot mount $EFS_ID at $shared (efs-utils: /var/log/amazon/efs/mount.log): is" \
      "there a mount target in this node's zone, open to its security group on port 2049, and does the VPC" \
      "resolve DNS names and give hostnames (enableDnsSupport, enableDnsHostnames)?" >&2
    exit 1
  fi
  sleep "$pause"
done

#!/usr/bin/env bash
# Mounts the cluster's EFS file system at /shared, now and at every boot, with TLS and IAM
# authorisation (efs-utils: `mount -t efs -o tls,iam`): the file system's policy (cluster.yaml,
# FileSystemPolicy) refuses any client without TLS, and any but the head node's and the compute
# nodes' roles; root is squashed except on the head node. Run as root by bootstrap_head.sh and
# join_compute.sh, with EFS_ID from /etc/hpctrain/cluster.env. FSTAB and SHARED are
# for the tests only.
set -euo pipefail
fstab=${FSTAB:-/etc/fstab}
shared=${SHARED:-/shared}
: "${EFS_ID:?}"

"$(dirname "${BASH_SOURCE[0]}")/install_efs_utils.sh"  # (nothing to do on a compute image)
# (efs-utils finds the region and this node's credentials in the instance metadata, as root.)
mkdir -p "$shared"
grep -q " $shared " "$fstab" ||
  echo "$EFS_ID:/ $shared efs _netdev,tls,iam 0 0" >> "$fstab"
until mountpoint -q "$shared" || mount "$shared"; do sleep 5; done

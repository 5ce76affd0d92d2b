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

# amazon-efs-utils is no Debian or Ubuntu package, and neither Debian 12 nor the Deep Learning
# AMI (Ubuntu 22.04) ships it: it is built into a .deb from AWS's repository at a pinned release
# tag, as its README says (build-deb.sh). v1.36.0, the last 1.x: 2.x needs rust 1.70 or newer,
# which Debian 12 lacks (1.63); 1.x is Python with stunnel for TLS. An image that has it
# (a compute image built once) skips this.
EFS_UTILS_TAG=v1.36.0
if ! command -v mount.efs > /dev/null; then
  apt-get -o DPkg::Lock::Timeout=600 install -y -q git binutils make stunnel4 nfs-common python3
  src=$(mktemp -d)
  git clone -q --depth 1 --branch "$EFS_UTILS_TAG" https://github.com/aws/efs-utils "$src"
  (cd "$src" && ./build-deb.sh)
  apt-get -o DPkg::Lock::Timeout=600 install -y -q "$src"/build/amazon-efs-utils*.deb
  rm -rf "$src"
fi
# (efs-utils finds the region and this node's credentials in the instance metadata, as root.)
mkdir -p "$shared"
grep -q " $shared " "$fstab" ||
  echo "$EFS_ID:/ $shared efs _netdev,tls,iam 0 0" >> "$fstab"
until mountpoint -q "$shared" || mount "$shared"; do sleep 5; done

#!/usr/bin/env bash
# Installs amazon-efs-utils (mount -t efs, with TLS and IAM authorisation) unless it is there: run
# as root by mount_shared.sh at every node's boot, and by prepare_compute.sh into the compute
# image (cloudformation/image.yaml), on which the boot then has nothing to do.
set -euo pipefail
# amazon-efs-utils is no Debian or Ubuntu package, and neither Debian 12 nor the Deep Learning
# AMI (Ubuntu 22.04) ships it: it is built into a .deb from AWS's repository at a pinned release
# tag, as its README says (build-deb.sh). v1.36.0, the last 1.x: 2.x needs rust 1.70 or newer,
# which Debian 12 lacks (1.63); 1.x is Python with stunnel for TLS. An image that has it
# (a compute image built once) skips this.
EFS_UTILS_TAG=v1.36.0
if (($# > 0)); then
  echo "install_efs_utils.sh: error: usage: install_efs_utils.sh (no arguments: installs amazon-efs-utils $EFS_UTILS_TAG unless mount.efs is there)" >&2
  exit 2
fi
if ! command -v mount.efs > /dev/null; then
  apt-get -o DPkg::Lock::Timeout=600 install -y -q git binutils make stunnel4 nfs-common python3
  src=$(mktemp -d)
  git clone -q --depth 1 --branch "$EFS_UTILS_TAG" https://github.com/aws/efs-utils "$src"
  (cd "$src" && ./build-deb.sh)
  apt-get -o DPkg::Lock::Timeout=600 install -y -q "$src"/build/amazon-efs-utils*.deb
  rm -rf "$src"
fi

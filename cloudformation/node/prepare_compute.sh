#!/usr/bin/env bash
# What a compute node needs before it can join Slurm: the packages (slurmd, munge, NFS, PMIx, boto3
# for the spot watcher and the watchdog, nftables for the metadata firewall), the CloudWatch agent,
# and hpctrain built with CUDA and installed into /usr/local. One script for both paths: the
# compute image's build runs it once (cloudformation/image.yaml), and join_compute.sh runs it at
# boot with --if-needed, which does nothing on an image made for this revision (a power-up then
# only joins Slurm) and installs everything on any other image (the slow fallback).
#
#   prepare_compute.sh REVISION              install, then write the marker naming REVISION
#   prepare_compute.sh --if-needed REVISION  the same, unless the marker already names REVISION
#
# Run as root from /opt/hpctrain/src (the repository at REVISION). The marker is
# /opt/hpctrain/image.json, beside that checkout; the build is in /opt/hpctrain/build, outside
# it, because every boot fetches the checkout again.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

usage="usage: prepare_compute.sh [--if-needed] REVISION"
if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then
  echo "$usage (installs the compute node's packages and hpctrain; run as root from /opt/hpctrain/src)"
  exit 0
fi
if_needed=0
[[ "${1:-}" == --if-needed ]] && { if_needed=1; shift; }
# (a REVISION that starts with '-' is an option this script does not have: refused before it installs)
if (($# != 1)) || [[ -z "$1" || "$1" == -* ]]; then
  echo "prepare_compute.sh: error: $usage" >&2
  exit 2
fi
revision=$1

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
home=$(dirname "$src")  # /opt/hpctrain
marker=$home/image.json
build=$home/build

# The revision the marker names, or nothing (no marker, or one that does not parse).
prepared_for() {
  python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["revision"])' "$marker" 2> /dev/null || true
}

if ((if_needed)) && [[ "$(prepared_for)" == "$revision" ]]; then
  echo "prepare_compute.sh: this image has hpctrain $revision ($marker): nothing to install"
  exit 0
fi
echo "prepare_compute.sh: installing the packages and building hpctrain $revision (marker: '$(prepared_for)')"
rm -f "$marker"  # a failed install below must not leave an old marker that a reboot would trust

# Every apt-get below, setup.sh's too, waits for dpkg's lock (unattended-upgrades holds it at
# boot) rather than fail: APT_CONFIG is read besides the system's configuration.
APT_CONFIG=$(mktemp)
export APT_CONFIG
trap 'rm -f "$APT_CONFIG"' EXIT
echo 'DPkg::Lock::Timeout "600";' > "$APT_CONFIG"
apt-get update -q
apt-get install -y -q git gpg nfs-common slurmd munge libpmix2 python3-boto3 nftables

# efs-utils, which mounts /shared (mount_shared.sh) with TLS and IAM authorisation.
"$(dirname "${BASH_SOURCE[0]}")/install_efs_utils.sh"

# The CloudWatch agent (the boot's user data installs it first when the image lacks it).
"$(dirname "${BASH_SOURCE[0]}")/install_cloudwatch_agent.sh" ubuntu  # its signature checked against AWS's key

# hpctrain with CUDA. GPU support is required (a build that quietly went CPU-only would train on
# the CPU), and no -march=native (any of the instance types may run it). The CUDA architectures
# are fixed (cmake/HpctrainGpu.cmake), so the build needs no GPU: the image builds on a CPU type.
# Installed into /usr/local/bin, where train.sbatch finds it (command -v) on a compute node.
BUILD_DIR=$build CMAKE_ARGS="-DHPCTRAIN_CUDA=ON -DHPCTRAIN_CUDNN=ON -DHPCTRAIN_NCCL=ON -DHPCTRAIN_NATIVE=OFF" \
  "$src/setup.sh"
cmake --install "$build" --prefix /usr/local > "$build/install.log"

commit=$(git -C "$src" rev-parse HEAD)
python3 -c 'import json, sys; print(json.dumps(dict(zip(("revision", "commit", "prepared"), sys.argv[1:]))))' \
  "$revision" "$commit" "$(date -u +%FT%TZ)" > "$marker.tmp"
mv "$marker.tmp" "$marker"
echo "prepare_compute.sh: hpctrain $revision ($commit) installed; marker $marker"

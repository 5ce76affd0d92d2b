#!/usr/bin/env bash
# The instance metadata service (169.254.169.254, fd00:ec2::254) hands out this node's role
# credentials to any process that asks; this closes it to all but the users that need it, now and
# on every boot, run as root by both nodes' bootstraps before anything else uses the node:
#
#   imds_firewall.sh [--root DIR] [--users USER,...] head|compute
#
#   head     root and slurm (the power-saving programs and the cluster manager run as slurm);
#   compute  root (the bootstrap, spot_watcher.py and computemgtd.py); slurmd requires the firewall,
#            so that no job runs on a node where it failed.
#   --users  another list (the tests); names are resolved to uids here, on this machine.
#   --root   install under DIR and enable there (systemctl --root) without starting anything (the
#            tests); without it the rules are loaded now.
#
# It writes /etc/hpctrain/imds.nft (imds_firewall.nft with the uids) and installs
# systemd/hpctrain-imds-firewall.service, which loads it early at boot (see the unit).
set -euo pipefail
node_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
unit=hpctrain-imds-firewall.service
error() { echo "imds_firewall.sh: error: $*" >&2; exit 2; }

root="" users="" kind=""
while (($#)); do
  case "$1" in
    --root) (($# >= 2)) || error "--root needs a directory"; root=$2; shift 2 ;;
    --users) (($# >= 2)) || error "--users needs a list of users"; users=$2; shift 2 ;;
    head | compute) kind=$1; shift ;;
    *) error "unknown argument '$1' (usage: imds_firewall.sh [--root DIR] [--users USER,...] head|compute)" ;;
  esac
done
case "$kind" in
  head) users=${users:-root,slurm} ;;
  compute) users=${users:-root} ;;
  *) error "no node kind given (head or compute)" ;;
esac

uids=()
for user in ${users//,/ }; do
  uid=$(id -u -- "$user" 2> /dev/null) || error "no user '$user' on this machine"
  uids+=("$uid")
done
((${#uids[@]})) || error "--users names no user"
uid_list=$(IFS=,; echo "${uids[*]}")
uid_list=${uid_list//,/, }

[[ -n "$root" ]] || [[ -x /usr/sbin/nft ]] || {
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  apt-get -o DPkg::Lock::Timeout=600 install -y -q nftables
}
install -d "$root/etc/hpctrain" "$root/etc/systemd/system"
{
  echo "# Written by imds_firewall.sh $kind: users $users."
  sed "s/@UIDS@/$uid_list/g" "$node_dir/imds_firewall.nft"
} > "$root/etc/hpctrain/imds.nft.new"
chmod 0644 "$root/etc/hpctrain/imds.nft.new"
mv "$root/etc/hpctrain/imds.nft.new" "$root/etc/hpctrain/imds.nft"
install -m 0644 "$node_dir/systemd/$unit" "$root/etc/systemd/system/$unit"
if [[ "$kind" == compute ]]; then
  install -d "$root/etc/systemd/system/slurmd.service.d"
  install -m 0644 "$node_dir/systemd/slurmd-imds-firewall.conf" \
    "$root/etc/systemd/system/slurmd.service.d/imds-firewall.conf"
fi

if [[ -n "$root" ]]; then
  systemctl --root="$root" --quiet enable "$unit"
else
  systemctl daemon-reload
  systemctl enable "$unit"
  # A reload when it runs already: the new rules without restarting slurmd, which requires it.
  systemctl reload-or-restart "$unit"
fi

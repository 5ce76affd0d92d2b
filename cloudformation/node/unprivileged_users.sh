#!/usr/bin/env bash
# Jobs run on a compute node under the uids of the head node's users (1000 and up: Debian's admin is
# 1000), and the compute image's own accounts have those uids too: on the Deep Learning AMI (Ubuntu)
# uid 1000 is cloud-init's default user, ubuntu, with passwordless sudo (/etc/sudoers.d/
# 90-cloud-init-users) and in the docker group. Any job could take root (`sudo -n`, a container), and
# with it the metadata service (this node's role: imds_firewall.sh lets root through) and the munge
# key. So, as AWS ParallelCluster's DisableSudoAccessForDefaultUser does, every account here of a
# regular uid (login.defs' UID_MIN to UID_MAX) is denied sudo, by a rule that sudo reads after every
# other (it reads /etc/sudoers.d in lexical order, and the last rule that matches decides: this one
# overrides cloud-init's and the groups' rules), and leaves the groups that give root or the system's
# logs. Root stays root: an administrator reaches it through Slurm, as root on the head node
# (docs/aws.md). Run as root by join_compute.sh at every power-up, before slurmd starts (cloud-init
# writes its rule at each new instance's first boot, on the compute image too).
#
#   unprivileged_users.sh [--root DIR]   (--root: a scratch root, the tests'; gpasswd --root)
set -euo pipefail
error() { echo "unprivileged_users.sh: error: $*" >&2; exit 2; }
# Groups whose members are root in all but name (sudo, admin and wheel through sudoers, docker and
# lxd through their daemons, disk through the block devices), and adm (the system's logs).
PRIVILEGED_GROUPS=(adm admin disk docker lxd sudo wheel)
RULE=/etc/sudoers.d/zz-hpctrain-no-sudo-for-users

root=""
while (($#)); do
  case "$1" in
    --root) (($# >= 2)) || error "--root needs a directory"; root=$2; shift 2 ;;
    *) error "unknown argument '$1' (usage: unprivileged_users.sh [--root DIR])" ;;
  esac
done
[[ -r "$root/etc/passwd" && -r "$root/etc/group" ]] || error "no $root/etc/passwd and $root/etc/group to read"

login_def() {  # login_def NAME DEFAULT: a setting of login.defs (Debian's and Ubuntu's default where it has none)
  local value
  value=$(awk -v k="$1" '$1 == k { v = $2 } END { print v }' "$root/etc/login.defs" 2> /dev/null || true)
  [[ "$value" =~ ^[0-9]+$ ]] && echo "$value" || echo "$2"
}
uid_min=$(login_def UID_MIN 1000)
uid_max=$(login_def UID_MAX 60000)
# name:uid:gid of each account of a regular uid
mapfile -t accounts < <(awk -F: -v lo="$uid_min" -v hi="$uid_max" '$3 >= lo && $3 <= hi { print $1 ":" $3 ":" $4 }' \
  "$root/etc/passwd")

gpasswd_root=()
[[ -z "$root" ]] || gpasswd_root=(-Q "$root")
for group in "${PRIVILEGED_GROUPS[@]}"; do
  line=$(awk -F: -v g="$group" '$1 == g' "$root/etc/group")
  [[ -n "$line" ]] || continue
  IFS=: read -r _ _ gid members <<< "$line"
  for account in "${accounts[@]}"; do
    IFS=: read -r name _ primary <<< "$account"
    # (a primary group cannot be left: such an account is no place for jobs)
    [[ "$primary" != "$gid" ]] || { echo "unprivileged_users.sh: error: $name's own group is $group" >&2; exit 1; }
    if [[ ",$members," == *",$name,"* ]]; then
      gpasswd "${gpasswd_root[@]}" -d "$name" "$group" > /dev/null
      echo "unprivileged_users.sh: $name is no longer in $group"
    fi
  done
done

install -d -m 0755 "$root/etc/sudoers.d"
# (sudo skips a file whose name has a dot: the new rule is read only once whole, and checked)
new="$root$RULE.new"
{
  echo "# Written by hpctrain's unprivileged_users.sh at boot: no sudo for the accounts of the uids that jobs"
  echo "# run as; read after every other file here, this rule is the last that matches, and decides."
  for account in "${accounts[@]}"; do
    IFS=: read -r name uid _ <<< "$account"
    echo "#$uid ALL=(ALL:ALL) !ALL  # $name"
  done
} > "$new"
chmod 0440 "$new"
if command -v visudo > /dev/null && ! out=$(visudo -c -q -f "$new" 2>&1); then
  rm -f "$new"
  echo "unprivileged_users.sh: error: visudo refuses the rule: ${out//$'\n'/ }" >&2
  exit 1
fi
mv "$new" "$root$RULE"
echo "unprivileged_users.sh: no sudo for ${#accounts[@]} account(s) of uids $uid_min to $uid_max (${RULE})"

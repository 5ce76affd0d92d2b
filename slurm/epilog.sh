#!/usr/bin/env bash
# Slurm epilog for nodes that run hpctrain: frees the host memory held by hpctrain's snapshots
# (hpctrain --snapshot-dir, default /dev/shm/hpctrain-UID) that no relaunch needs any more: those
# last written over an hour ago (hpctrain keeps a failed or killed run's that long for a relaunch
# to resume from) and not held by a running hpctrain, and, at any age, those of a run that has
# ended since (a job requeued off this node that finished on others: its checkpoint directory
# says so). A run that finishes on this node has removed its own already. The job's user's first,
# then every other user's default folder on the node, each as its user: a node that a requeued
# job left holds its snapshots until some job's epilog runs there, whoever's job that is.
#
# Install: in slurm.conf, on every compute node (ParallelCluster: a custom slurm.conf setting),
#   Epilog=/usr/share/hpctrain/slurm/epilog.sh      (or this checkout's slurm/epilog.sh)
# slurmd runs it as root on every node of a job when the job ends; it runs
# `hpctrain clean-snapshots` as each folder's user. It never fails (a failing epilog drains the node)
# and gives up after CLEAN_TIMEOUT (SIGTERM, then SIGKILL CLEAN_KILL_AFTER later: a stat of a hung
# hard-mounted NFS or EFS waits in a sleep only a fatal signal ends, and slurmd would keep the node
# COMPLETING while it waits). slurm/local-cluster.sh sets it up for its clusters.
#
# Settings (edit here; slurmd gives an epilog no variables of the job's):
HPCTRAIN=${HPCTRAIN:-}            # the hpctrain binary; empty: this checkout's build/, else PATH
SNAPSHOT_DIR=${SNAPSHOT_DIR:-}    # where the jobs keep snapshots, if not the default (then only the job's user's)
SNAPSHOT_ROOT=${SNAPSHOT_ROOT:-/dev/shm}  # where hpctrain's default folders (hpctrain-UID) are
CLEAN_ARGS=${CLEAN_ARGS:-}        # more clean-snapshots options (--older-than 30m)
CLEAN_TIMEOUT=${CLEAN_TIMEOUT:-60}        # seconds the cleanup may take before its SIGTERM
CLEAN_KILL_AFTER=${CLEAN_KILL_AFTER:-10}  # and then before its SIGKILL

# say MESSAGE: one line to the system log and stderr (slurmd keeps neither of an epilog's streams).
say() {
  echo "epilog.sh: error: $1" >&2
  logger -t hpctrain-epilog "error: $1" 2> /dev/null || true
}
# A setting it cannot use: one line and no cleanup, exit 0 all the same (a failing epilog drains the
# node). CLEAN_TIMEOUT=0 (or CLEAN_KILL_AFTER=0) was timeout's "no limit": a cleanup hung on a dead
# file system held the node COMPLETING for ever; CLEAN_TIMEOUT=abc made every cleanup fail unseen.
for setting in CLEAN_TIMEOUT CLEAN_KILL_AFTER; do
  value=${!setting}
  if ! [[ "$value" =~ ^[0-9]{1,5}$ ]] || ((10#$value < 1 || 10#$value > 86400)); then
    say "$setting must be a whole number of seconds, 1 to 86400, not '$value': no snapshots cleaned"
    exit 0
  fi
  printf -v "$setting" %d "$((10#$value))"
done
# CLEAN_ARGS' words, split at blanks as an unquoted $CLEAN_ARGS is, but never expanded as a
# pattern: a '*' or '?' in one was replaced by the names of the files it matched in slurmd's
# directory.
clean_args=()
IFS=$' \t\n' read -r -d '' -a clean_args <<< "$CLEAN_ARGS" || true
uid=${SLURM_JOB_UID:-}
[[ "$uid" =~ ^[0-9]+$ ]] || exit 0
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [[ -n "$HPCTRAIN" ]]; then
  # (A directory passes -x: every cleanup failed with 126, unseen.)
  [[ -f "$HPCTRAIN" && -x "$HPCTRAIN" ]] || { say "HPCTRAIN '$HPCTRAIN' is not an executable file: no snapshots cleaned"; exit 0; }
else
  HPCTRAIN=$here/../build/src/hpctrain
  [[ -f "$HPCTRAIN" && -x "$HPCTRAIN" ]] || HPCTRAIN=$(PATH=/usr/local/bin:/usr/bin:/bin command -v hpctrain) || exit 0
fi

# clean UID DIR: hpctrain clean-snapshots on DIR as the user UID; its code (timeout's 124 or 137
# when it had to be ended).
clean() {
  local as_user=() gid
  if [[ "$1" != "$(id -u)" ]]; then
    gid=$(id -g "$1" 2> /dev/null) || return 0
    as_user=(setpriv --reuid="$1" --regid="$gid" --clear-groups)
  fi
  # A clean environment: none of Slurm's job variables, which would make MPI look for a job step.
  env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/ timeout -k "$CLEAN_KILL_AFTER" "$CLEAN_TIMEOUT" "${as_user[@]}" \
    "$HPCTRAIN" clean-snapshots --snapshot-dir "$2" "${clean_args[@]}" 2>&1 | logger -t hpctrain-epilog 2> /dev/null
  return "${PIPESTATUS[0]}"
}

if [[ -n "$SNAPSHOT_DIR" ]]; then
  [[ -d "$SNAPSHOT_DIR" ]] && clean "$uid" "$SNAPSHOT_DIR"
  exit 0
fi
# The default folders: the job's user's first, then the others'. Each only where its name and its
# owner agree (never a link): the cleanup never runs as a user whose number another put on a folder.
# An empty one (hpctrain leaves the folder when it removes a run's) is passed over: nothing to free,
# and a node where many users have trained would otherwise start a cleanup for each, every job.
own_folder() { [[ "$2" =~ ^[0-9]+$ && -d "$1" && ! -L "$1" && "$(stat -c %u "$1")" == "$2" ]]; }
has_entries() { [[ -n "$(find "$1" -mindepth 1 -maxdepth 1 -print -quit 2> /dev/null)" ]]; }
folders=("$SNAPSHOT_ROOT/hpctrain-$uid")
for dir in "$SNAPSHOT_ROOT"/hpctrain-*; do [[ "$dir" == "${folders[0]}" ]] || folders+=("$dir"); done
for dir in "${folders[@]}"; do
  owner=${dir##*/hpctrain-}
  if ! own_folder "$dir" "$owner" || ! has_entries "$dir"; then continue; fi
  clean "$owner" "$dir"
  case $? in 124 | 137) break ;; esac  # a hung file system: each of the others would wait as long
done
exit 0

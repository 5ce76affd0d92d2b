#!/usr/bin/env bash
# Slurm epilog for nodes that run hpctrain: frees the host memory held by the job's user's
# snapshots (hpctrain --snapshot-dir, default /dev/shm/hpctrain-UID) that no relaunch needs any
# more: those last written over an hour ago (hpctrain keeps a failed or killed run's that long
# for a relaunch to resume from) and not held by a running hpctrain, and, at any age, those of a
# run that has ended since (a job requeued off this node that finished on others: its checkpoint
# directory says so). A run that finishes on this node has removed its own already.
#
# Install: in slurm.conf, on every compute node (ParallelCluster: a custom slurm.conf setting),
#   Epilog=/usr/share/hpctrain/slurm/epilog.sh      (or this checkout's slurm/epilog.sh)
# slurmd runs it as root on every node of a job when the job ends; it runs
# `hpctrain clean-snapshots` as the job's user. It never fails (a failing epilog drains the node)
# and gives up after CLEAN_TIMEOUT (SIGTERM, then SIGKILL CLEAN_KILL_AFTER later: a stat of a hung
# hard-mounted NFS or EFS waits in a sleep only a fatal signal ends, and slurmd would keep the node
# COMPLETING while it waits). slurm/local-cluster.sh sets it up for its clusters.
#
# Settings (edit here; slurmd gives an epilog no variables of the job's):
HPCTRAIN=${HPCTRAIN:-}            # the hpctrain binary; empty: this checkout's build/, else PATH
SNAPSHOT_DIR=${SNAPSHOT_DIR:-}    # where the jobs keep snapshots, if not the default
CLEAN_ARGS=${CLEAN_ARGS:-}        # more clean-snapshots options (--older-than 30m)
CLEAN_TIMEOUT=${CLEAN_TIMEOUT:-60}        # seconds the cleanup may take before its SIGTERM
CLEAN_KILL_AFTER=${CLEAN_KILL_AFTER:-10}  # and then before its SIGKILL

uid=${SLURM_JOB_UID:-}
[[ "$uid" =~ ^[0-9]+$ ]] || exit 0
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[[ -n "$HPCTRAIN" ]] || HPCTRAIN=$here/../build/src/hpctrain
[[ -x "$HPCTRAIN" ]] || HPCTRAIN=$(PATH=/usr/local/bin:/usr/bin:/bin command -v hpctrain) || exit 0
dir=${SNAPSHOT_DIR:-/dev/shm/hpctrain-$uid}
[[ -d "$dir" ]] || exit 0

as_user=()
if [[ "$uid" != "$(id -u)" ]]; then
  gid=$(id -g "$uid" 2> /dev/null) || exit 0
  as_user=(setpriv --reuid="$uid" --regid="$gid" --clear-groups)
fi
# A clean environment: none of Slurm's job variables, which would make MPI look for a job step.
# shellcheck disable=SC2086  # CLEAN_ARGS: words, as on a command line
env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/ timeout -k "$CLEAN_KILL_AFTER" "$CLEAN_TIMEOUT" "${as_user[@]}" "$HPCTRAIN" clean-snapshots \
  --snapshot-dir "$dir" $CLEAN_ARGS 2>&1 | logger -t hpctrain-epilog 2> /dev/null
exit 0

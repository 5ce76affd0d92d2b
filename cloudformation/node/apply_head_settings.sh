#!/usr/bin/env bash
# Applies the head node's settings (/etc/hpctrain/cluster.env, values single-quoted) to Slurm:
# slurm.conf and gres.conf rendered again and slurmctld (re)started, which keeps its state and
# queue (StateSaveLocation). Run as root by bootstrap_head.sh at the first boot, and by cfn-hup
# (the "update" config set of cluster.yaml's HeadNode) when a stack update changes the settings:
# cloud.json needs nothing more (the cloud programs read it on each run).
#
# The cluster's name is fixed at creation: slurmctld keeps it in its state (StateSaveLocation's
# clustername) and dies at start under another ("CLUSTER NAME MISMATCH"), and without it the
# compute nodes' watchdogs shut them down, jobs and all. A CLUSTER_NAME other than the state's is
# refused (cluster.yaml's Images resource refuses such an update before it reaches this node; this
# holds where it did not): slurm.conf keeps the state's, the other settings are applied, and this
# says so in one line and exits 1 (cfn-hup logs the failure). And slurmctld must answer (scontrol ping) within
# --wait seconds of its restart, or this exits 1: the packaged unit is Type=simple, whose restart
# succeeds even when slurmctld dies at once.
#
#   apply_head_settings.sh [--env FILE] [--out DIR] [--state-dir DIR] [--wait SECONDS]
#       (defaults /etc/hpctrain/cluster.env, /etc/slurm, /var/spool/slurmctld, 60)
set -euo pipefail
env_file=/etc/hpctrain/cluster.env
out=/etc/slurm
state_dir=/var/spool/slurmctld
wait_seconds=60
while (($#)); do
  case "$1" in
    --env) env_file=${2:?--env needs a file}; shift 2 ;;
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --state-dir) state_dir=${2:?--state-dir needs a directory}; shift 2 ;;
    --wait) wait_seconds=${2:?--wait needs a number of seconds}; shift 2 ;;
    *) echo "apply_head_settings.sh: error: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ "$wait_seconds" =~ ^[0-9]+$ ]] ||
  { echo "apply_head_settings.sh: error: --wait takes whole seconds, not '$wait_seconds'" >&2; exit 2; }
# shellcheck source=/dev/null
. "$env_file"
node_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

cluster=$CLUSTER_NAME
saved=""
if [[ -f "$state_dir/clustername" ]]; then saved=$(< "$state_dir/clustername"); fi
renamed=0
if [[ -n "$saved" && "$saved" != "$CLUSTER_NAME" ]]; then
  cluster=$saved
  renamed=1
  echo "apply_head_settings.sh: error: ClusterName '$CLUSTER_NAME' refused: slurmctld's state ($state_dir) is" \
    "cluster '$saved', fixed at creation (slurmctld would not start under another name); slurm.conf keeps" \
    "'$saved' and the other settings are applied: give ClusterName '$saved' back in the stack" >&2
fi

python3 "$node_dir/render_slurm_conf.py" --cluster "$cluster" --controller "$(hostname -s)" \
  --max-nodes "$MAX_NODES" --cpus "$CPUS" --gpus "$GPUS" --memory-mib "$MEMORY_MIB" \
  --suspend-minutes "$SUSPEND_MINUTES" --resume-timeout "$RESUME_TIMEOUT" --programs "$node_dir" \
  --state-dir "$state_dir" --out "$out"
# The munge key's export follows the compute subnets (once bootstrap_head.sh has made it).
if [[ -d /etc/hpctrain/keys ]]; then python3 "$node_dir/export_munge_key.py"; fi
# A restart, not `scontrol reconfigure`: node definitions (MaxComputeNodes, CPUs, GPUs) change
# only with a restart, and the queue survives it.
systemctl enable slurmctld && systemctl restart slurmctld
deadline=$((SECONDS + wait_seconds))
until [[ "$(SLURM_CONF="$out/slurm.conf" scontrol ping 2> /dev/null)" == *" is UP"* ]]; do
  if ((SECONDS >= deadline)); then
    echo "apply_head_settings.sh: error: slurmctld does not answer $wait_seconds s after its restart: see" \
      "'journalctl -u slurmctld' and its log (SlurmctldLogFile in $out/slurm.conf)" >&2
    exit 1
  fi
  sleep 1
done
((renamed == 0)) || exit 1
echo "apply_head_settings.sh: Slurm's configuration applied from $env_file"

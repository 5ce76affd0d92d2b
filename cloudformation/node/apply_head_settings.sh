#!/usr/bin/env bash
# Applies the head node's settings (/etc/hpctrain/cluster.env, values single-quoted) to Slurm:
# slurm.conf and gres.conf rendered again and slurmctld (re)started, which keeps its state and
# queue (StateSaveLocation). Run as root by bootstrap_head.sh at the first boot, and by cfn-hup
# (the "update" config set of cluster.yaml's HeadNode) when a stack update changes the settings:
# cloud.json needs nothing more (the cloud programs read it on each run).
#
#   apply_head_settings.sh [--env FILE] [--out DIR]   (defaults /etc/hpctrain/cluster.env, /etc/slurm)
set -euo pipefail
env_file=/etc/hpctrain/cluster.env
out=/etc/slurm
while (($#)); do
  case "$1" in
    --env) env_file=${2:?--env needs a file}; shift 2 ;;
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    *) echo "apply_head_settings.sh: error: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
# shellcheck source=/dev/null
. "$env_file"
node_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

python3 "$node_dir/render_slurm_conf.py" --cluster "$CLUSTER_NAME" --controller "$(hostname -s)" \
  --max-nodes "$MAX_NODES" --cpus "$CPUS" --gpus "$GPUS" --memory-mib "$MEMORY_MIB" \
  --suspend-minutes "$SUSPEND_MINUTES" --resume-timeout "$RESUME_TIMEOUT" --programs "$node_dir" \
  --out "$out"
# The munge key's export follows the compute subnets (once bootstrap_head.sh has made it).
if [[ -d /etc/hpctrain/keys ]]; then python3 "$node_dir/export_munge_key.py"; fi
# A restart, not `scontrol reconfigure`: node definitions (MaxComputeNodes, CPUs, GPUs) change
# only with a restart, and the queue survives it.
systemctl enable slurmctld && systemctl restart slurmctld
echo "apply_head_settings.sh: Slurm's configuration applied from $env_file"

#!/usr/bin/env python3
"""Renders the cluster's Slurm configuration (slurm.conf and gres.conf) for the head node's
bootstrap: a controller on the head node and up to N cloud compute nodes (State=CLOUD) that
Slurm's power saving starts on demand through resume.py and stops after SuspendTime idle
minutes through suspend.py, so that an idle cluster runs no compute instance at all.

    render_slurm_conf.py --cluster NAME --controller HOST --max-nodes N --cpus C --gpus G
        --memory-mib M [--suspend-minutes 10] [--resume-timeout 1800] [--programs DIR]
        [--state-dir DIR] [--spool-dir DIR] [--log-dir DIR] [--port P] [--munge-socket PATH]
        [--epilog PATH] --out DIR
"""

import argparse
import os
import re
import sys

from hpc_cloud import OneLineParser

# Seconds Slurm gives SuspendProgram before the node may be powered up again (suspend.py's
# EC2 deadline is derived from it).
SUSPEND_TIMEOUT = 120


def positive(text):
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, not {text}")
    return value


def non_negative(text):
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, not {text}")
    return value


def slurm_name(text):
    if not re.fullmatch(r"[a-z][a-z0-9-]{0,30}", text):
        raise argparse.ArgumentTypeError(f"'{text}' is not a name Slurm takes (a-z, 0-9, -; 31 at most)")
    return text


def render(a):
    nodes = f"{a.node_prefix}-[1-{a.max_nodes}]" if a.max_nodes > 1 else f"{a.node_prefix}-1"
    auth = f"AuthInfo=socket={a.munge_socket}\n" if a.munge_socket else ""
    gres = f" Gres=gpu:{a.gpus}" if a.gpus else ""
    # The epilog frees the host memory of hpctrain snapshots that no relaunch needs (slurm/epilog.sh).
    epilog = f"Epilog={a.epilog}\n" if a.epilog else ""
    conf = f"""# Rendered by hpctrain's cloudformation/node/render_slurm_conf.py for cluster {a.cluster}.
ClusterName={a.cluster}
SlurmctldHost={a.controller}
SlurmctldPort={a.port}
SlurmdPort={a.port + 1}
SlurmUser=slurm
AuthType=auth/munge
CredType=cred/munge
{auth}StateSaveLocation={a.state_dir}
SlurmdSpoolDir={a.spool_dir}
SlurmctldPidFile={a.state_dir}/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile={a.log_dir}/slurmctld.log
SlurmdLogFile={a.log_dir}/slurmd.log
# linuxproc, not cgroup: the compute image (Ubuntu 22.04) mounts cgroup v2 only, which its
# slurmd (21.08) cannot use; nodes are given to one job at a time (OverSubscribe=EXCLUSIVE), so
# cgroup confinement would buy little, and every job's processes are still found and killed.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
MpiDefault=pmix
GresTypes=gpu
JobRequeue=1
MailProg=/bin/true
ReturnToService=2
KillWait=30
{epilog}SlurmdTimeout=300
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
# Power saving: nodes are instances that exist only while Slurm wants them.
SuspendProgram={a.programs}/suspend.py
ResumeProgram={a.programs}/resume.py
ResumeFailProgram={a.programs}/resume_fail.py
SuspendTime={a.suspend_minutes * 60}
SuspendTimeout={SUSPEND_TIMEOUT}
ResumeTimeout={a.resume_timeout}
ResumeRate=0
SuspendRate=0
TreeWidth=65533
PrivateData=cloud
CommunicationParameters=NoAddrCache
SlurmctldParameters=enable_configless,idle_on_node_suspend
NodeName={nodes} State=CLOUD CPUs={a.cpus} RealMemory={a.memory_mib}{gres}
PartitionName={a.partition} Nodes={nodes} Default=YES MaxTime=INFINITE State=UP OverSubscribe=EXCLUSIVE
"""
    gres_conf = f"NodeName={nodes} Name=gpu File=/dev/nvidia[0-{a.gpus - 1}]\n" if a.gpus else ""
    return conf, gres_conf


def main():
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cluster", type=slurm_name, required=True)
    p.add_argument("--controller", required=True, help="the head node's short host name")
    p.add_argument("--max-nodes", type=positive, required=True)
    p.add_argument("--cpus", type=positive, required=True, help="vCPUs per compute instance")
    p.add_argument("--gpus", type=non_negative, required=True, help="GPUs per compute instance")
    p.add_argument("--memory-mib", type=positive, required=True, help="memory Slurm may give jobs, per node")
    p.add_argument("--node-prefix", type=slurm_name, default="gpu")
    p.add_argument("--partition", type=slurm_name, default="gpu")
    p.add_argument("--suspend-minutes", type=positive, default=10)
    p.add_argument("--resume-timeout", type=positive, default=1800)
    p.add_argument("--programs", default="/opt/hpctrain/cloud")
    p.add_argument("--state-dir", default="/var/spool/slurmctld")
    p.add_argument("--spool-dir", default="/var/spool/slurmd")
    p.add_argument("--log-dir", default="/var/log/slurm")
    p.add_argument("--port", type=positive, default=6817)
    p.add_argument("--munge-socket", default="")
    p.add_argument("--epilog", default="/opt/hpctrain/src/slurm/epilog.sh",
                   help="run on every node at a job's end: frees hpctrain's snapshots no relaunch needs ('' for none)")
    p.add_argument("--out", required=True, help="directory for slurm.conf and gres.conf")
    a = p.parse_args()
    conf, gres_conf = render(a)
    os.makedirs(a.out, exist_ok=True)
    for name, text in (("slurm.conf", conf), ("gres.conf", gres_conf)):
        tmp = os.path.join(a.out, f".{name}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, os.path.join(a.out, name))
    return 0


if __name__ == "__main__":
    sys.exit(main())

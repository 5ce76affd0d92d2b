#!/usr/bin/env python3
"""Slurm's SuspendProgram: terminates the instances that stand for the given nodes (found by
their hpctrain:node tag, in this cluster only), forgets their launch tokens (the next power-up
is a new launch) and resets the nodes' addresses to their names, so that powered-down nodes cost
nothing. An instance it fails to terminate is the cluster manager's to find as an orphan.

All of it holding the state file's lock, which resume.py takes to launch: Slurm powers a node up
again SuspendTimeout after it asked for the power-down, and this program may still be waiting
for EC2 (throttled, retried) or for the lock then. A resume.py that comes first launches the node
a new instance (suspending() tells it not to take the old one for its own) and records the
launch; a node launched after this program was asked is left alone, its new instance and address
kept. One that comes after finds the node's launch forgotten and its old instance going.

    suspend.py NODELIST       (slurm.conf: SuspendProgram=...)
"""

import logging
import sys
import time

from hpc_cloud import State, aws_worst_case, ec2_client, instances_of, main_wrapper, scontrol, suspending
from render_slurm_conf import SUSPEND_TIMEOUT

# Seconds an EC2 call may try (hpc_cloud.aws_client): Slurm may power the node up again
# SuspendTimeout (120 s) after it asked for the power-down. An endpoint that never answers fails
# the first call within aws_worst_case(45) = 95 s, and every later one at once; the 25 s left are
# the scontrol calls' that reset the nodes' addresses.
EC2_DEADLINE = SUSPEND_TIMEOUT - aws_worst_case(0) - 25


def suspend(cfg, nodes):
    """0, or 1 when EC2 could not be read or refused the termination: the nodes are powered down
    all the same (their launches forgotten, their addresses reset), and the instances left are
    the cluster manager's to terminate as orphans."""
    asked = time.time()
    with suspending(cfg["state_file"]), State(cfg["state_file"]) as state:
        resumed = [n for n in nodes if state.launches.get(n, {}).get("at", 0) > asked]
        for node in resumed:
            logging.info("%s: powered up again since the power-down was asked: its new instance is kept", node)
        return power_down(cfg, state, [n for n in nodes if n not in resumed])


def power_down(cfg, state, nodes):
    from botocore.exceptions import BotoCoreError, ClientError

    if not nodes:
        return 0
    found, ids, described, terminated = {}, [], False, True
    try:
        ec2 = ec2_client(cfg, EC2_DEADLINE)
        found = instances_of(ec2, cfg, nodes)
        described = True
        ids = [i for node in nodes for i in found.get(node, [])]
        if ids:
            ec2.terminate_instances(InstanceIds=ids)
    except (BotoCoreError, ClientError) as e:
        what = ", ".join(ids) if described else "the instances of " + ", ".join(nodes)
        logging.error("cannot terminate %s: %s (the cluster manager terminates them as orphans)", what, e)
        terminated = False
    for node in nodes:
        state.launches.pop(node, None)
    for node in nodes:
        if node in found:
            done = "terminated" if terminated else "failed to terminate"
            logging.info("%s: %s %s", node, done, ", ".join(found[node]))
        else:
            logging.info("%s: %s", node, "no instance" if described else "its instances unknown (EC2 not read)")
        scontrol("update", f"nodename={node}", f"nodeaddr={node}", f"nodehostname={node}")
    return 0 if terminated else 1


if __name__ == "__main__":
    sys.exit(main_wrapper("suspend.py", suspend))

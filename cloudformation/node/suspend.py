#!/usr/bin/env python3
"""Slurm's SuspendProgram: terminates the instances that stand for the given nodes (found by
their hpctrain:node tag, in this cluster only), forgets their launch tokens (the next power-up
is a new launch) and resets the nodes' addresses to their names, so that powered-down nodes cost
nothing. An instance it fails to terminate is the cluster manager's to find as an orphan.

    suspend.py NODELIST       (slurm.conf: SuspendProgram=...)
"""

import logging
import sys

from hpc_cloud import State, ec2_client, instances_of, main_wrapper, scontrol


def suspend(cfg, nodes):
    from botocore.exceptions import BotoCoreError, ClientError

    ec2 = ec2_client(cfg)
    found = instances_of(ec2, cfg, nodes)
    ids = [i for node in nodes for i in found.get(node, [])]
    terminated = True
    try:
        if ids:
            ec2.terminate_instances(InstanceIds=ids)
    except (BotoCoreError, ClientError) as e:  # the nodes are powered down all the same
        logging.error("cannot terminate %s: %s (the cluster manager terminates them as orphans)", ", ".join(ids), e)
        terminated = False
    with State(cfg["state_file"]) as state:
        for node in nodes:
            state.launches.pop(node, None)
    for node in nodes:
        done = "terminated" if terminated else "failed to terminate"
        logging.info("%s: %s", node, f"{done} {', '.join(found[node])}" if node in found else "no instance")
        scontrol("update", f"nodename={node}", f"nodeaddr={node}", f"nodehostname={node}")
    return 0 if terminated else 1


if __name__ == "__main__":
    sys.exit(main_wrapper("suspend.py", suspend))

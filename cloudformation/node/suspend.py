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
    """0, or 1 when EC2 could not be read or refused the termination: the nodes are powered down
    all the same (their launches forgotten, their addresses reset), and the instances left are
    the cluster manager's to terminate as orphans."""
    from botocore.exceptions import BotoCoreError, ClientError

    found, ids, described, terminated = {}, [], False, True
    try:
        ec2 = ec2_client(cfg)
        found = instances_of(ec2, cfg, nodes)
        described = True
        ids = [i for node in nodes for i in found.get(node, [])]
        if ids:
            ec2.terminate_instances(InstanceIds=ids)
    except (BotoCoreError, ClientError) as e:
        what = ", ".join(ids) if described else "the instances of " + ", ".join(nodes)
        logging.error("cannot terminate %s: %s (the cluster manager terminates them as orphans)", what, e)
        terminated = False
    with State(cfg["state_file"]) as state:
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

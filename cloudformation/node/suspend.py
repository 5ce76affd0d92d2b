#!/usr/bin/env python3
"""Slurm's SuspendProgram: terminates the instances that stand for the given nodes (found by
their hpctrain:node tag, in this cluster only), forgets their launch tokens (the next power-up
is a new launch) and resets the nodes' addresses to their names, so that powered-down nodes cost
nothing. An instance it fails to terminate is the cluster manager's to find as an orphan.

All of it holding the state file's lock, which resume.py takes to launch: Slurm powers a node up
again SuspendTimeout after it asked for the power-down, and this program may still be waiting
for EC2 (throttled, retried) then. A resume.py that comes first launches the node a new instance
(suspending() tells it not to take the old one for its own) and records the launch; a node
launched after this program was asked is left alone, its new instance and address kept. One that
comes after finds the node's launch forgotten and its old instance going. The launches are marked
to be forgotten (hpc_cloud.mark_forgotten) before anything else: this program killed midway, a
resume.py that comes later still launches anew, rather than take the old instance, left
running or going, for a retry of its launch.

The lock is waited for LOCK_WAIT seconds at most (resume.py may hold it for minutes, a cluster
manager pass too), so that the whole run stays within SuspendTimeout. Not had by then, the nodes
are powered down all the same without touching EC2: their addresses reset, their launches marked
to be forgotten by the next program that takes the lock (hpc_cloud.mark_forgotten: a resume.py
then launches anew rather than take an old instance for a retry), and their instances left to the
cluster manager, whose next pass after SuspendTimeout finds them owned by powered-down nodes and
terminates them as orphans (exit code 1, one line in the log).

    suspend.py NODELIST       (slurm.conf: SuspendProgram=...)
"""

import contextlib
import logging
import sys
import time

from hpc_cloud import (SLURM_TIMEOUT, State, StateBusy, aws_worst_case, ec2_client, instances_of, main_wrapper,
                       mark_forgotten, scontrol, suspending)
from render_slurm_conf import SUSPEND_TIMEOUT

# Seconds this program waits for the state file's lock at most: what it waited is taken from its
# EC2 deadline (below), so that a full wait leaves EC2 15 s of tries.
LOCK_WAIT = 30
# Seconds the scontrol calls that reset the nodes' addresses may take together (each is killed
# when they are spent, hpc_cloud.scontrol's own 60 s notwithstanding, and the nodes not reached
# are said in one line: resume.py gives a node its address on its next power-up).
SCONTROL_TIME = 25
# Seconds an EC2 call may try (hpc_cloud.aws_client) when the lock was had at once, less the
# seconds waited for it: Slurm may power the node up again SuspendTimeout (120 s) after it asked
# for the power-down. An endpoint that never answers fails the first call within
# aws_worst_case(45 - waited) = 95 s - waited, and every later one at once; the SCONTROL_TIME left
# are the scontrol calls'. Worst case in all: LOCK_WAIT or less + 95 s less that + 25 s = 120 s.
EC2_DEADLINE = SUSPEND_TIMEOUT - aws_worst_case(0) - SCONTROL_TIME


def ec2_deadline(waited):
    """The EC2 deadline of a run that waited `waited` seconds (at most LOCK_WAIT) for the lock."""
    return max(0.0, EC2_DEADLINE - waited)


def suspend(cfg, nodes):
    """0, or 1 when EC2 could not be read or refused the termination, or the state file stayed
    locked: the nodes are powered down all the same (their launches forgotten, their addresses
    reset), and the instances left are the cluster manager's to terminate as orphans."""
    asked, start = time.time(), time.monotonic()
    with suspending(cfg["state_file"]), contextlib.ExitStack() as held:
        marked = mark_first(cfg, nodes, asked)
        try:
            state = held.enter_context(State(cfg["state_file"], wait=LOCK_WAIT))
        except StateBusy as e:
            return leave_to_the_cluster_manager(cfg, nodes, asked, e, marked)
        resumed = [n for n in nodes if state.launches.get(n, {}).get("at", 0) > asked]
        for node in resumed:
            logging.info("%s: powered up again since the power-down was asked: its new instance is kept", node)
        return power_down(cfg, state, [n for n in nodes if n not in resumed], ec2_deadline(time.monotonic() - start))


def mark_first(cfg, nodes, asked):
    """Marks the launches of `nodes` to be forgotten (hpc_cloud.mark_forgotten) before anything is
    done: this run killed before it forgets them (SIGKILL, slurmctld's restart killing its
    children), Slurm has the nodes powered down all the same, and a resume.py that came before the
    cluster manager's next pass would take the old instance, going or not, for a retry of its
    launch; the mark makes that a new launch, the old instance terminated. Applied (and removed)
    by this run's own hold of the lock when it gets that far. Whether it was written: one that
    cannot be (a full disk) is said, and the run goes on."""
    try:
        mark_forgotten(cfg["state_file"], nodes, asked)
        return True
    except OSError as e:
        logging.warning("%s: launches not marked to be forgotten before the power-down: %s", ",".join(nodes), e)
        return False


def leave_to_the_cluster_manager(cfg, nodes, asked, why, marked=False):
    """The state file's lock not had in time: the nodes powered down without EC2 (see the top)."""
    if not marked:  # (still suspending(): resume.py takes no record for a retry)
        mark_forgotten(cfg["state_file"], nodes, asked)
    logging.error("%s: instances not terminated: %s; the cluster manager terminates them as orphans once the "
                  "nodes are powered down", ",".join(nodes), why)
    reset_addresses(nodes)
    return 1


def reset_addresses(nodes, seconds=SCONTROL_TIME):
    """Resets each node's address to its name (scontrol), all the calls within `seconds`: each call
    gets what is left of them (at most hpc_cloud.scontrol's own bound), and once they are spent
    (slurmctld hung) the nodes left are said in one line, not waited for. Whether all were asked."""
    until = time.monotonic() + seconds
    for i, node in enumerate(nodes):
        left = min(SLURM_TIMEOUT, until - time.monotonic())
        if left <= 0:
            logging.error("%s: addresses not reset: scontrol's %g s are spent (slurmctld hung?); resume.py gives "
                          "each its address on its next power-up", ",".join(nodes[i:]), seconds)
            return False
        scontrol("update", f"nodename={node}", f"nodeaddr={node}", f"nodehostname={node}", timeout=left)
    return True


def power_down(cfg, state, nodes, deadline=EC2_DEADLINE):
    from botocore.exceptions import BotoCoreError, ClientError

    if not nodes:
        return 0
    found, ids, described, terminated = {}, [], False, True
    try:
        ec2 = ec2_client(cfg, deadline)
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
    reset_addresses(nodes)
    return 0 if terminated else 1


if __name__ == "__main__":
    sys.exit(main_wrapper("suspend.py", suspend))

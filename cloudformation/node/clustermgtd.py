#!/usr/bin/env python3
"""The cluster manager (as ParallelCluster's clustermgtd): one pass, run every minute on the head
node by a systemd timer (hpctrain-clustermgtd.timer), as Slurm's user. Each pass makes EC2 and
Slurm agree, and does nothing when they already do, so it is safe to run twice or at once (a
second pass started while one runs exits at once):

  1. writes the heartbeat file (heartbeat_file, on /shared) that each compute node's watchdog
     (computemgtd.py) reads: a head node that stops writing it has its compute nodes terminate
     themselves;
  2. forgets capacity cooldowns that have expired (resume.py tries that choice again);
  3. terminates orphans: instances tagged for this cluster that no powered-up Slurm node owns
     (a node that is powered down, a node Slurm does not have, a second instance for a node
     registered at another address), once older than orphan_grace_seconds;
  4. sets down a powered-up node whose instance has gone (a spot reclaim), so that its jobs are
     requeued now instead of after SlurmdTimeout;
  5. returns to service the nodes this cluster left down or drained (reasons starting
     "hpctrain: ", and Slurm's own for a failed cloud node, such as "Not responding"): one that
     still has jobs is left to finish them; one without is powered down (suspend.py terminates
     its instance); a powered-down one is resumed (idle~, ready for the next job). A node down
     for lack of capacity waits until a choice's cooldown is over. Nodes drained or set down for
     any other reason (an administrator's) are left alone.

    clustermgtd.py       (settings: HPCTRAIN_CLOUD_CONFIG, as the power-saving programs)
"""

import fcntl
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from hpc_cloud import (CLUSTER_TAG, LIVE_STATES, NODE_TAG, ConfigError, OWN_REASON_PREFIX, State, ec2_client,
                       is_own_reason, load_config, scontrol, set_down, setup_logging)
from resume import available_choices, subnet_zones

# sinfo's fields, each padded to its width and ended by "|" (a reason may hold spaces).
SINFO_FORMAT = "NodeList:100|,StateComplete:200|,Reason:300|,NodeAddr:100|"


@dataclass
class Node:
    name: str
    states: set = field(default_factory=set)  # Slurm's state and flags, upper case
    reason: str = ""
    addr: str = ""

    def has(self, *flags):
        return any(f in self.states for f in flags)

    @property
    def powered_down(self):
        return self.has("POWERED_DOWN") and not self.has("POWERING_UP")

    @property
    def in_transition(self):
        return self.has("POWERING_UP", "POWERING_DOWN", "POWER_DOWN")

    @property
    def busy(self):
        return self.has("ALLOCATED", "MIXED", "COMPLETING")

    @property
    def failed(self):
        """Down, or drained with no job left on it."""
        return self.has("DOWN") or (self.has("DRAIN") and not self.busy)


def parse_sinfo(text):
    nodes = {}
    for line in text.splitlines():
        fields = [f.strip() for f in line.split("|")]
        if len(fields) < 4 or not fields[0]:
            continue
        name, state, reason, addr = fields[:4]
        nodes[name] = Node(name, {s.upper() for s in state.split("+") if s}, "" if reason == "none" else reason, addr)
    return nodes


def slurm_nodes():
    r = subprocess.run(["sinfo", "--noheader", "--Node", "--Format", SINFO_FORMAT],
                       capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"sinfo failed ({r.returncode}): {r.stderr.strip()}")
    return parse_sinfo(r.stdout)


def cluster_instances(ec2, cfg):
    """The cluster's live compute instances: [{id, node, ip, launched (epoch s)}]."""
    filters = [{"Name": f"tag:{CLUSTER_TAG}", "Values": [cfg["cluster"]]},
               {"Name": "instance-state-name", "Values": LIVE_STATES}]
    found = []
    for page in ec2.get_paginator("describe_instances").paginate(Filters=filters):
        for reservation in page["Reservations"]:
            for inst in reservation["Instances"]:
                tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
                if NODE_TAG in tags:  # (the head node carries the cluster tag too, not a node's)
                    found.append({"id": inst["InstanceId"], "node": tags[NODE_TAG],
                                  "ip": inst.get("PrivateIpAddress", ""), "launched": inst["LaunchTime"].timestamp()})
    return found


def write_heartbeat(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".heartbeat.")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(f"{time.time():.0f}\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def orphans(instances, nodes, grace, now):
    """The instances no powered-up node owns, older than `grace` seconds, with why. Of several
    instances for one powered-up node, the one at the node's address (else the oldest) is its."""
    found = []
    for inst in instances:
        node = nodes.get(inst["node"])
        if now - inst["launched"] < grace:
            continue
        if node is None:
            found.append((inst, "Slurm has no such node"))
        elif node.powered_down:
            found.append((inst, "its node is powered down"))
        else:
            mine = [i for i in instances if i["node"] == node.name]
            keep = next((i for i in mine if i["ip"] == node.addr), min(mine, key=lambda i: i["launched"]))
            if inst is not keep:
                found.append((inst, f"a second instance for its node, which has {keep['id']}"))
    return found


def repair(node, owned, capacity_left):
    """The one action that brings `node` closer to service, or None."""
    if node.in_transition:
        return None
    if not node.powered_down and not node.failed and node.addr not in ("", node.name) and not owned:
        return ("down", "instance gone")
    if not node.failed or not is_own_reason(node.reason):
        return None  # healthy, still running its jobs, or an administrator's
    if not node.powered_down:
        return ("power_down_force", None)
    if node.reason.startswith(f"{OWN_REASON_PREFIX}resume failed") and not capacity_left:
        return None  # every launch choice is cooling down: resumed now, it would fail again
    return ("resume", None)


def manage(cfg):
    actions = []
    write_heartbeat(cfg["heartbeat_file"])
    ec2 = ec2_client(cfg)
    with State(cfg["state_file"]) as state:
        now = time.time()
        for key in [k for k, until in state.cooldowns.items() if until <= now]:
            del state.cooldowns[key]
            actions.append(f"{key}: cooldown over, enabled again")
        nodes = slurm_nodes()
        instances = cluster_instances(ec2, cfg)
        lost = orphans(instances, nodes, cfg["orphan_grace_seconds"], now)
        if lost:
            ec2.terminate_instances(InstanceIds=[inst["id"] for inst, _ in lost])
            actions += [f"{inst['node']}: terminated orphan {inst['id']} ({why})" for inst, why in lost]
        orphaned = {inst["id"] for inst, _ in lost}
        capacity_left = bool(available_choices(cfg, state, subnet_zones(ec2, cfg)))
        for node in nodes.values():
            if node.powered_down:
                state.launches.pop(node.name, None)  # its next power-up is a new launch
            owned = [i for i in instances if i["node"] == node.name and i["id"] not in orphaned]
            action = repair(node, owned, capacity_left)
            if action is None:
                continue
            what, reason = action
            if what == "down":
                set_down(node.name, reason)
            else:
                scontrol("update", f"nodename={node.name}", f"state={what}")
            actions.append(f"{node.name}: {what} (was {'+'.join(sorted(node.states)).lower()}"
                           f"{', ' + node.reason if node.reason else ''})")
    for a in actions:
        logging.info("%s", a)
    if not actions:
        logging.info("nothing to do: %d nodes, %d instances", len(nodes), len(instances))
    return 0


def main():
    if len(sys.argv) > 1:
        print(__doc__.strip(), file=sys.stderr if sys.argv[1] not in ("-h", "--help") else sys.stdout)
        return 0 if sys.argv[1] in ("-h", "--help") else 2
    try:
        cfg = load_config()
    except ConfigError as e:
        print(f"clustermgtd.py: error: {e}", file=sys.stderr)
        return 2
    setup_logging(cfg, "clustermgtd")
    os.makedirs(os.path.dirname(cfg["state_file"]) or ".", exist_ok=True)
    with open(cfg["state_file"] + ".clustermgtd.lock", "a", encoding="utf-8") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logging.info("another pass is running")
            return 0
        try:
            return manage(cfg)
        except Exception as e:  # noqa: BLE001 - one line in the log; the timer runs the next pass
            logging.error("pass failed: %s: %s", type(e).__name__, e)
            return 1


if __name__ == "__main__":
    sys.exit(main())

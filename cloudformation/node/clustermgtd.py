#!/usr/bin/env python3
"""The cluster manager (as ParallelCluster's clustermgtd): one pass, run every minute on the head
node by a systemd timer (hpctrain-clustermgtd.timer), as Slurm's user. Each pass makes EC2 and
Slurm agree, and does nothing when they already do, so it is safe to run twice or at once (a
second pass started while one runs exits at once):

  1. writes the heartbeat file (heartbeat_file, on /shared) that each compute node's watchdog
     (computemgtd.py) reads, once it has read both Slurm's nodes (sinfo) and EC2's instances: a
     head node that stops writing it, or whose slurmctld or EC2 cannot be read, has its compute
     nodes terminate themselves once Slurm has them down or cannot be reached;
  2. forgets capacity cooldowns that have expired (resume.py tries that choice again);
  3. terminates orphans: instances tagged for this cluster that no powered-up Slurm node owns
     (a node that is powered down, a node Slurm does not have, a second instance for a node
     registered at another address), once older than orphan_grace_seconds;
  4. sets down a powered-up node whose instance has gone (a spot reclaim), so that its jobs are
     requeued now instead of after SlurmdTimeout (Slurm read again just before: a node that
     suspend.py powered down meanwhile is left alone);
  5. returns to service the nodes this cluster left down or drained (reasons starting
     "hpctrain: ", and Slurm's own for a failed cloud node, such as "Not responding"): one that
     still has jobs is left to finish them; one without is powered down (suspend.py terminates
     its instance); a powered-down one is resumed (idle~, ready for the next job). A node down
     for lack of capacity waits until a choice's cooldown is over. Nodes drained or set down for
     any other reason (an administrator's) are left alone;
  6. protected mode (as ParallelCluster's): counts failed boots in a row per partition (a node
     down with "ResumeTimeout reached", resume_fail.py's reason, resume.py's "resume failed" for
     any cause but lack of capacity, EC2's throttling or failure, a launch refused for want of
     permission or a launch not started in time after slow ones, or powering up while its instance
     has gone, which it sets
     down at once rather than let Slurm wait ResumeTimeout, unless EC2 took the instance back (a spot reclaim,
     capacity it could not keep: RECLAIM_CODES), which cools that choice down instead); a node of the partition that comes up
     after its launch counts it from 0 again. At protected_failure_count (cloud.json, default 10;
     0: never) the partition's nodes are no longer returned to service: each powered-down one is
     set DOWN with a reason starting "hpctrain: protected mode: " (sinfo -R), and the log and the
     CloudWatch metrics hpctrain/FailedBootsInARow and ProtectedMode (dimensions Cluster,
     Partition) say so. An operator who has fixed the cause resumes any of those nodes
     (scontrol update nodename=NODE state=resume): the partition leaves protected mode, its count
     starts from 0, and this program returns its other nodes to service.

The state file's lock, which resume.py and suspend.py wait for (each for a bounded time), is not
held while Slurm and EC2 are read, nor for the calls that act (terminations, scontrol, CloudWatch):
only to decide and to record. A node whose launch resume.py records, or suspend.py forgets,
meanwhile (fresh_launches) is left to the next pass: its instance is no orphan, its boot not
lost, its launch not forgotten. A pass waits for the lock LOCK_WAIT seconds at most: not had (a
resume.py launching a large power-up, or hung), the pass is skipped with one line and exit code 1,
the heartbeat written, and the next pass tries again. Nodes set DOWN for protected mode by a pass
stopped before it recorded them (killed, or the lock not had within RECORD_WAIT) are recorded by
the next pass from their reason (record_protected).

    clustermgtd.py       (settings: HPCTRAIN_CLOUD_CONFIG, as the power-saving programs)
"""

import contextlib
import fcntl
import logging
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field

import hpc_cloud
from hpc_cloud import (CAPACITY_ERRORS, CLUSTER_TAG, EC2_NOT_HAD, JOB_CANNOT_START, NODE_TAG, NOT_IN_TIME,
                       REFUSED_ERRORS, STATE_LOCKED, TRANSIENT_ERRORS, EC2_DEADLINE, ConfigError, OWN_REASON_PREFIX,
                       State, StateBusy, aws_client, cooldown_key, ec2_client, is_own_reason, live_instances,
                       load_config, open_lock, peek_launches, scontrol, set_down, setup_logging, write_atomically)
from resume import available_choices, cool_down, subnet_zones

# sinfo's fields, each padded to its width and ended by "|" (a reason may hold spaces). With
# --Node, a node in several partitions has a line for each.
SINFO_FORMAT = "NodeList:100|,StateComplete:200|,Reason:300|,NodeAddr:100|,PartitionName:100|"
RESUME_FAILED = f"{OWN_REASON_PREFIX}resume failed"
PROTECTED_PREFIX = f"{OWN_REASON_PREFIX}protected mode: "
# Down reasons that say a node's boot failed: Slurm's when ResumeTimeout passed, resume_fail.py's
# (which replaces it), and this program's for a node whose instance is gone during power-up.
# resume.py's RESUME_FAILED is one too unless for lack of capacity (see failed_boot).
FAILED_BOOT_REASONS = ("ResumeTimeout reached", f"{OWN_REASON_PREFIX}did not come up within ResumeTimeout",
                       f"{OWN_REASON_PREFIX}boot failed")
LOST_BOOT = "boot failed: its instance is gone during power-up"
# EC2's reasons (an instance's StateReason code) for taking back an instance it had launched: a spot
# reclaim, or on-demand capacity it could not keep. The node's boot did not fail: a partition whose
# spot market is tight must not be stopped by them. Such a lost boot is set down with RECLAIMED
# (which failed_boot does not take) and its choice cooled down, as resume.py does on a capacity error.
RECLAIM_CODES = {"Server.SpotInstanceTermination", "Server.InsufficientInstanceCapacity"}
RECLAIMED = "instance taken back by EC2 during power-up"
# Seconds a pass waits for the state file's lock at most: to decide (else the pass is skipped, said
# in one line: a resume.py launching a large power-up holds it for minutes, one hung for ever, and
# the next pass tries again), and to record the nodes it set DOWN for protected mode (else the
# next pass records them: record_protected). With the reads' and calls' bounds, within the unit's
# TimeoutStartSec (power_test).
LOCK_WAIT = 10
RECORD_WAIT = 5
METRIC_NAMESPACE = "hpctrain"  # cluster.yaml's head-node policy allows PutMetricData in this one only


@dataclass
class Node:
    name: str
    states: set = field(default_factory=set)  # Slurm's state and flags, upper case
    reason: str = ""
    addr: str = ""
    partitions: set = field(default_factory=set)

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

    @property
    def up(self):
        """Powered up and registered with slurmctld: its boot worked."""
        return (self.has("IDLE", "ALLOCATED", "MIXED", "COMPLETING") and not self.powered_down
                and not self.in_transition and not self.has("DOWN", "NOT_RESPONDING"))


def parse_sinfo(text):
    nodes = {}
    for line in text.splitlines():
        fields = [f.strip() for f in line.split("|")]
        if len(fields) < 5 or not fields[0]:
            continue
        name, state, reason, addr, partition = fields[:5]
        node = nodes.setdefault(name, Node(name, {s.upper() for s in state.split("+") if s},
                                           "" if reason == "none" else reason, addr))
        node.partitions.add(partition)
    return nodes


def slurm_nodes():
    try:
        r = subprocess.run(["sinfo", "--noheader", "--Node", "--Format", SINFO_FORMAT],
                           capture_output=True, text=True, timeout=hpc_cloud.SLURM_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"sinfo failed: no answer within {hpc_cloud.SLURM_TIMEOUT:g} s (slurmctld hung?)") from None
    if r.returncode != 0:
        raise RuntimeError(f"sinfo failed ({r.returncode}): {r.stderr.strip()}")
    return parse_sinfo(r.stdout)


def cluster_instances(ec2, cfg):
    """The cluster's live compute instances: [{id, node, ip, launched (epoch s)}]."""
    return [{"id": inst["InstanceId"], "node": node, "ip": inst.get("PrivateIpAddress", ""),
             "launched": inst["LaunchTime"].timestamp()}
            for node, found in live_instances(ec2, cfg).items() for inst in found]


def write_heartbeat(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_atomically(path, f"{time.time():.0f}\n", 0o644)


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


def failed_boot(node):
    """Whether `node` is down because its boot failed: not for lack of capacity (that has its
    cooldown), not because its job lost another node's launch (all or nothing), not for an
    administrator's reason, not for a launch token to retry (nothing ran),
    not for EC2's throttling or its own failure, nor for EC2 not had (no answer, no credentials),
    the state file held too long by a pass, or a launch not started in time after slow ones
    (nothing of the node's), nor for a launch refused for want of permission (REFUSED_ERRORS:
    nothing launched; a stack update's instance types refused until cfn-hup applies it)."""
    if not node.has("DOWN"):
        return False
    if node.reason.startswith(RESUME_FAILED):
        why = node.reason[len(RESUME_FAILED):].lstrip(": ")
        return (not why.startswith(("no capacity", "launch token", *EC2_NOT_HAD, JOB_CANNOT_START, STATE_LOCKED,
                                    NOT_IN_TIME))
                and why.split(":")[0] not in CAPACITY_ERRORS | TRANSIENT_ERRORS | REFUSED_ERRORS)
    return node.reason.startswith(FAILED_BOOT_REASONS)


def boot_lost(node, owned, launch, grace, now):
    """Whether `node` is powering up without its instance (it shut itself down on a bootstrap
    error, or EC2 took it back): Slurm would wait ResumeTimeout for it, billing nothing but the
    job's time. `grace` after the launch, as for orphans: a new instance may not be listed yet."""
    return (node.has("POWERING_UP") and not node.has("DOWN") and node.addr not in ("", node.name) and not owned
            and now - (launch or {}).get("at", 0) >= grace)


def gone_instances(ec2, cfg, nodes):
    """{node: [EC2's descriptions]} of the instances of `nodes` (boot_lost's candidates) that are
    shutting down or terminated, read without the state file's lock; None where EC2 cannot be read
    (said in the log: their boots count as failed, as before this was asked)."""
    from botocore.exceptions import BotoCoreError, ClientError

    # By the cluster's tag only, as live_instances (more than 200 nodes would be refused as a filter).
    filters = [{"Name": f"tag:{CLUSTER_TAG}", "Values": [cfg["cluster"]]},
               {"Name": "instance-state-name", "Values": ["shutting-down", "terminated"]}]
    found = {}
    try:
        for page in ec2.get_paginator("describe_instances").paginate(Filters=filters):
            for inst in (i for r in page["Reservations"] for i in r["Instances"]):
                node = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}.get(NODE_TAG)
                if node in nodes:
                    found.setdefault(node, []).append(inst)
    except (BotoCoreError, ClientError) as e:
        logging.warning("cannot read why the instances of %s are gone (counted as failed boots): %s",
                        ",".join(sorted(nodes)), e)
        return None
    return found


def reclaimed_boots(gone, cfg, lost, launches):
    """{node: (why, cooldown key)} of the nodes in `lost` (boot_lost) whose instance EC2 took back
    (RECLAIM_CODES): the newest of the node's instances gone (`gone`: gone_instances), launched
    since its launch record (a minute's leeway for the clocks)."""
    newest = {}
    for node in lost:
        since = (launches.get(node) or {}).get("at", 0) - 60
        for inst in (gone or {}).get(node, []):
            if inst["LaunchTime"].timestamp() >= since and (
                    node not in newest or inst["LaunchTime"] > newest[node]["LaunchTime"]):
                newest[node] = inst
    found = {}
    for node, inst in newest.items():
        code = inst.get("StateReason", {}).get("Code", "")
        if code in RECLAIM_CODES:
            # The key resume.py gives this choice: "template" where it names no type or subnet.
            market = "spot" if inst.get("InstanceLifecycle") == "spot" else "on-demand"
            key = cooldown_key(inst.get("InstanceType") if cfg["instance_types"] else None, market,
                               inst.get("Placement", {}).get("AvailabilityZone") if cfg["subnet_ids"] else None)
            found[node] = (f"{RECLAIMED}: {inst['InstanceId']} {code}", key)
    return found


def repair(node, owned, capacity_left, protected=None, lost=None):
    """The one action that brings `node` closer to service (or, in a `protected` partition, to
    DOWN for protected mode), or None. `lost`: why its boot is lost (boot_lost), if it is."""
    if lost:
        return ("boot_failed", lost)
    if node.in_transition:
        return None
    if not node.powered_down and not node.failed and node.addr not in ("", node.name) and not owned:
        return ("down", "instance gone")
    if not node.failed or not is_own_reason(node.reason):
        if protected and node.powered_down and not node.failed:
            return ("protect", protected)
        return None  # healthy, still running its jobs, or an administrator's
    if not node.powered_down:
        return ("power_down_force", None)  # its instance is terminated, protected or not
    if protected:
        return None if node.reason.startswith(PROTECTED_PREFIX) else ("protect", protected)
    if node.reason.startswith((RESUME_FAILED, OWN_REASON_PREFIX + RECLAIMED)) and not capacity_left:
        return None  # every launch choice is cooling down: resumed now, it would fail again
    return ("resume", None)


def record_protected(state, nodes):
    """Records in its partition's protected mode each node that Slurm has DOWN for it (reason
    PROTECTED_PREFIX) and the record lacks: a pass stopped (killed, the state file's lock not had)
    between its scontrol and the hold that records the node. Unrecorded, an operator's resume of
    that node would not end protected mode, and the node would be set DOWN again. Returns what
    happened."""
    lines = []
    for node in sorted(nodes.values(), key=lambda n: n.name):
        if not (node.has("DOWN") and node.reason.startswith(PROTECTED_PREFIX)):
            continue
        named = re.search(r" in partition (\S+?), see ", node.reason)  # (apply's reason; cut at 200 characters)
        partition = named.group(1) if named else None
        if partition not in state.protected or partition not in node.partitions:
            partition = protected_partition(state, node)
        if partition is not None and node.name not in state.protected[partition]["nodes"]:
            state.protected[partition]["nodes"].append(node.name)
            lines.append(f"{node.name}: recorded as set DOWN for protected mode of {partition} (by a pass stopped "
                         "before it recorded it)")
    return lines


def leave_protected_mode(state, nodes):
    """Ends protected mode for each partition of which an operator resumed a node that this
    program set DOWN for it; returns those partitions and what happened."""
    left, lines = set(), []
    for partition, record in sorted(state.protected.items()):
        resumed = [n for n in record["nodes"] if n in nodes and not nodes[n].has("DOWN")]
        if resumed:
            del state.protected[partition]
            state.boot_failures.pop(partition, None)
            left.add(partition)
            lines.append(f"{partition}: protected mode left ({resumed[0]} was resumed by hand): its nodes return to"
                         " service, failed boots counted from 0")
    return left, lines


def count_boots(state, nodes, lost, fresh=()):
    """Counts this pass's boots in the partitions not protected: a node that came up after its
    launch (resume.py's record; not one of `fresh`, recorded after Slurm was read) sets its
    partitions' counts to 0; a failed boot not yet counted adds 1 (a node stays down for several
    passes: it is counted once, until it is back in service). Returns the partitions whose count
    changed and what happened."""
    changed, lines = set(), []
    for name in [n for n in state.counted_failures if n not in nodes or not nodes[n].has("DOWN")]:
        del state.counted_failures[name]  # back in service: its next failure is a new one
    for node in nodes.values():  # successes first, as ParallelCluster: only failures after them count
        launch = state.launches.get(node.name)
        if launch is not None and not launch.get("up") and node.up and node.name not in fresh:
            launch["up"] = True
            for partition in sorted(node.partitions - set(state.protected)):
                if state.boot_failures.pop(partition, 0):
                    changed.add(partition)
                    lines.append(f"{partition}: {node.name} came up: failed boots counted from 0")
    for node in nodes.values():
        reason = lost.get(node.name) or (node.reason if failed_boot(node) else "")
        if not reason or node.name in state.counted_failures:
            continue
        state.counted_failures[node.name] = reason
        for partition in sorted(node.partitions - set(state.protected)):
            state.boot_failures[partition] = state.boot_failures.get(partition, 0) + 1
            changed.add(partition)
            lines.append(f"{partition}: {node.name}: failed boot, {state.boot_failures[partition]} in a row ({reason})")
    return changed, lines


def enter_protected_mode(cfg, state, nodes, now):
    """Puts each partition whose count reached protected_failure_count (perhaps lowered since) in
    protected mode; returns them, and for each the line the log gives it."""
    limit = cfg["protected_failure_count"]
    entered, alerts = set(), []
    for partition, count in sorted(state.boot_failures.items()):
        if not limit or count < limit or partition in state.protected:
            continue
        state.protected[partition] = {"since": now, "nodes": []}
        entered.add(partition)
        members = ",".join(sorted(n.name for n in nodes.values() if partition in n.partitions))
        alerts.append(f"{partition}: protected mode: {count} failed boots in a row; its nodes are set DOWN and no"
                      " longer powered up. Fix the cause, then resume any of them (scontrol update nodename=NODE"
                      f" state=resume; nodes: {members})")
    return entered, alerts


def metric_data(cfg, state, partitions):
    """hpctrain/FailedBootsInARow and ProtectedMode (0 or 1) for each of `partitions`."""
    data = []
    for partition in sorted(partitions):
        dims = [{"Name": "Cluster", "Value": cfg["cluster"]}, {"Name": "Partition", "Value": partition}]
        data += [{"MetricName": "FailedBootsInARow", "Dimensions": dims, "Unit": "Count",
                  "Value": state.boot_failures.get(partition, 0)},
                 {"MetricName": "ProtectedMode", "Dimensions": dims, "Unit": "None",
                  "Value": 1 if partition in state.protected else 0}]
    return data


def put_metrics(cfg, data):
    """A report: a failure to put the metrics is logged, and the pass goes on."""
    if not data:
        return
    try:
        cloudwatch = aws_client("cloudwatch", cfg["region"], EC2_DEADLINE)  # (hpc_cloud.EC2_DEADLINE: its budget)
        cloudwatch.put_metric_data(Namespace=METRIC_NAMESPACE, MetricData=data)
    except Exception as e:  # noqa: BLE001 - botocore's errors, and any other: the metric must not stop the pass
        logging.warning("cannot put the CloudWatch metrics %s: %s: %s",
                        sorted({d["Dimensions"][1]["Value"] for d in data}), type(e).__name__, e)


def protected_partition(state, node):
    return next((p for p in sorted(node.partitions) if p in state.protected), None)


def still_gone(todo):
    """repair's actions (`todo`: [(node, action)]) less each "down" (instance gone) whose node Slurm,
    read again just before it, no longer has powered up as it was read (powering down or down,
    its address reset): suspend.py powered it down meanwhile, its instance terminated after Slurm
    was read and before EC2 was (a node whose launch is not in the state file: fresh_launches
    cannot tell). Set down, it would be out of service a pass longer. Returns them, and what
    happened; with Slurm not read again, the downs are left to the next pass."""
    downs = sorted(node.name for node, (what, _) in todo if what == "down")
    if not downs:
        return todo, []
    try:
        again = slurm_nodes()
    except RuntimeError as e:
        return ([(node, action) for node, action in todo if action[0] != "down"],
                [f"{','.join(downs)}: instance gone, not set down yet: Slurm not read again ({e})"])
    kept, lines = [], []
    for node, action in todo:
        now = again.get(node.name)
        if action[0] == "down" and (now is None or now.powered_down or now.in_transition or now.failed
                                    or now.addr != node.addr):
            state = "+".join(sorted(now.states)).lower() if now else "no such node"
            lines.append(f"{node.name}: instance gone, not set down: Slurm has it {state} now (powered down meanwhile)")
            continue
        kept.append((node, action))
    return kept, lines


def apply(node, action):
    """Carries out repair's `action` on `node` (scontrol, not holding the state file's lock);
    whether Slurm took it."""
    what, arg = action
    if what in ("down", "boot_failed"):
        done = set_down(node.name, arg)
        if done and what == "boot_failed":
            scontrol("update", f"nodename={node.name}", "state=power_down_force")  # Slurm would wait ResumeTimeout
        return done
    if what == "protect":
        partition, count = arg
        return set_down(node.name, f"protected mode: {count} failed boots in a row in partition {partition},"
                                   " see docs/aws.md")
    return scontrol("update", f"nodename={node.name}", f"state={what}")


def beat(cfg):
    """Writes the heartbeat; False (said in the log) when it cannot: the pass's work is done all
    the same."""
    try:
        write_heartbeat(cfg["heartbeat_file"])
        return True
    except OSError as e:  # (the shared file system not mounted, EIO)
        logging.error("cannot write the heartbeat %s: %s; the pass goes on", cfg["heartbeat_file"], e)
        return False


def read_zones(ec2, cfg):
    """The subnets' zones (resume.subnet_zones), or None where EC2 cannot say (said in the log):
    then the nodes down for lack of capacity wait for a pass that can tell whether a choice is
    free again; the rest of the pass goes on."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return subnet_zones(ec2, cfg)
    except (BotoCoreError, ClientError) as e:
        logging.warning("cannot read the subnets' zones (nodes down for lack of capacity wait for the next pass): %s",
                        e)
        return None


def fresh_launches(state, seen):
    """The nodes whose launch record (under the lock) is not the one `seen` before Slurm and EC2
    were read (hpc_cloud.peek_launches): a power-up that resume.py recorded since, whose instance
    this pass may not have listed and whose node Slurm may no longer show as read; or a launch
    forgotten since (suspend.py terminated its instance, perhaps after Slurm was read: the node
    is powering down, not one whose instance is gone). Such a node is left to the next pass: its
    instances are no orphans, its boot not lost, its launch kept, no action taken on it."""
    now = {name: launch["token"] for name, launch in state.launches.items()}
    before = {name: launch["token"] for name, launch in seen.items()}
    return {name for name in set(now) | set(before) if now.get(name) != before.get(name)}


def manage(cfg):
    """One pass. Slurm and EC2 are read, and the slow calls made (terminations, scontrol, the
    metrics), without the state file's lock, which resume.py and suspend.py wait for (each for a
    bounded time): it is held only to decide and to record, for no call to Slurm or AWS."""
    actions = []
    ec2 = ec2_client(cfg)
    grace = cfg["orphan_grace_seconds"]
    read_at = time.time()
    seen = peek_launches(cfg["state_file"])
    nodes = slurm_nodes()
    instances = cluster_instances(ec2, cfg)
    # Only now, with Slurm and EC2 both read (as ParallelCluster's clustermgtd): a pass that
    # cannot read them (slurmctld down, EC2 refusing) cleans up nothing, and a heartbeat it
    # wrote would keep every compute node's watchdog from terminating its idle instance.
    beating = beat(cfg)
    listed = {i["node"] for i in instances}
    # The nodes that may have lost their boot (boot_lost before the launch records are had), and
    # why their instances are gone.
    candidates = {n.name for n in nodes.values() if boot_lost(n, n.name in listed, None, 0, read_at)}
    gone_found = gone_instances(ec2, cfg, candidates) if candidates else {}
    zones = read_zones(ec2, cfg)
    with contextlib.ExitStack() as held:
        try:
            state = held.enter_context(State(cfg["state_file"], wait=LOCK_WAIT))
        except StateBusy as e:  # (a resume.py launching a large power-up, or one hung)
            logging.warning("pass skipped: %s; nothing decided or done (the heartbeat is written, the next pass tries "
                            "again)", e)
            return 1
        now = time.time()
        for key in [k for k, until in state.cooldowns.items() if until <= now]:
            del state.cooldowns[key]
            actions.append(f"{key}: cooldown over, enabled again")
        cooled = len(actions)  # (the orphans' lines come next, once they are terminated)
        fresh = fresh_launches(state, seen)
        # (resume.py holds the lock from before it launches until it has recorded the launch: an
        # instance this pass listed was recorded by now, and its node's launch is fresh if Slurm
        # may not have shown its power-up.)
        lost = orphans([i for i in instances if i["node"] not in fresh], nodes, grace, read_at)
        orphaned = {inst["id"] for inst, _ in lost}
        owned = {name: [i for i in instances if i["node"] == name and i["id"] not in orphaned] for name in nodes}
        gone = {n.name: LOST_BOOT for n in nodes.values()
                if n.name not in fresh and boot_lost(n, owned[n.name], state.launches.get(n.name), grace, read_at)}
        reclaimed = reclaimed_boots(gone_found, cfg, gone, state.launches) if gone else {}
        for name, (why, key) in sorted(reclaimed.items()):
            gone[name] = why
            if not state.cooling(key):
                cool_down(cfg, state, key)
            actions.append(f"{name}: not a failed boot: {why}; {key} cooling down")
        lost_boots = {name: OWN_REASON_PREFIX + why for name, why in gone.items() if name not in reclaimed}
        actions += record_protected(state, nodes)
        left, lines = leave_protected_mode(state, nodes)
        changed, counted = count_boots(state, nodes, lost_boots, fresh)
        actions += lines + counted
        entered, alerts = enter_protected_mode(cfg, state, nodes, now)
        capacity_left = zones is not None and bool(available_choices(cfg, state, zones))
        todo = []
        for node in nodes.values():
            if node.name in fresh:
                continue  # powered up since it was read: the next pass sees it as it is
            if node.powered_down:
                state.launches.pop(node.name, None)  # its next power-up is a new launch
            partition = protected_partition(state, node)
            action = repair(node, owned[node.name], capacity_left, partition, gone.get(node.name))
            if action is not None:
                if action[0] == "protect":
                    action = ("protect", (partition, state.boot_failures.get(partition, 0)))
                todo.append((node, action))
        metrics = metric_data(cfg, state, left | changed | entered)
    # Said first: a pass stopped while it acts (killed) would otherwise leave protected mode
    # entered in the state file and never said (the next pass finds nothing changed).
    put_metrics(cfg, metrics)
    for a in alerts:
        logging.error("%s", a)
    # Not holding the lock: EC2's and Slurm's calls, as slow as they are. A power-up that resume.py
    # records meanwhile finds the orphans' launches forgotten (above): their instances, which it
    # would take for earlier power-ups' too, are terminated by whichever comes first.
    if lost:
        ec2.terminate_instances(InstanceIds=[inst["id"] for inst, _ in lost])
        actions[cooled:cooled] = [f"{inst['node']}: terminated orphan {inst['id']} ({why})" for inst, why in lost]
    todo, lines = still_gone(todo)
    actions += lines
    protected = []
    for node, action in todo:
        if apply(node, action) and action[0] == "protect":
            protected.append((action[1][0], node.name))
        actions.append(f"{node.name}: {action[0]} (was {'+'.join(sorted(node.states)).lower()}"
                       f"{', ' + node.reason if node.reason else ''})")
    if protected:  # the nodes set DOWN for protected mode: an operator resuming one of them ends it
        try:
            with State(cfg["state_file"], wait=RECORD_WAIT) as state:
                for partition, name in protected:
                    if partition in state.protected and name not in state.protected[partition]["nodes"]:
                        state.protected[partition]["nodes"].append(name)
        except StateBusy as e:
            actions.append(f"{','.join(name for _, name in protected)}: set DOWN for protected mode, not yet recorded:"
                           f" {e}; the next pass records them from their reason")
    for a in actions:
        logging.info("%s", a)
    if not actions:
        logging.info("nothing to do: %d nodes, %d instances", len(nodes), len(instances))
    return 0 if beating else 1


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
    with open_lock(cfg["state_file"] + ".clustermgtd.lock") as lock:
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

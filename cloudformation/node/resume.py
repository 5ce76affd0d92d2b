#!/usr/bin/env python3
"""Slurm's ResumeProgram: launches one EC2 instance per node name Slurm asks for, from the
cluster's launch template, tags the instance, its volumes and its network interface as it is
created (the head node's IAM policy allows no launch without them), and tells Slurm each
instance's address (scontrol update nodeaddr/nodehostname), taken from RunInstances' answer; only
an instance without one there is described, again with a growing pause while EC2 does not yet
know it (its API is eventually consistent). A node whose instance has no address after two
minutes, or is already shutting down, is set down and the instance terminated.

It tries the configured choices in order: market (spot first with market "spot", then on-demand
if spot_fallback), then instance type (instance_types), then subnet (subnet_ids; with EFA only the
first, the zone of the cluster placement group). A capacity
error disables that (instance type, market, zone) for capacity_cooldown_seconds, for this node
and the next ones, and the next choice is tried; an error that refuses spot in the whole account
(the spot service-linked role missing) disables spot in every type and zone, and on-demand is
tried (with spot_fallback). A node that gets no instance is set down with EC2's reason, so that
Slurm requeues the job that asked for it; the cluster manager returns it to service.

All or nothing per job: a job whose nodes cannot all get an instance would not start, and the
instances its other nodes got would run idle, billed, until Slurm suspends them (and the next
try after the cooldown would do it again, for ever on an account whose quota holds fewer nodes
than the job). So, where Slurm says which jobs the nodes are for (SLURM_RESUME_FILE, Slurm 22.05
on), once a node gets no instance its job's nodes not yet launched are not tried, and those
launched in this call are terminated, all set down with the reason "its job cannot start" (the
cluster manager does not count it toward protected mode). A node that another job, which may
still start, also needs is kept; so is every node of a call that Slurm gives no jobs for
(`scontrol power_up`, or an older Slurm). Each launch
carries a ClientToken kept in the state file until the node is suspended: run again for the same
power-up (a retry, a lost reply), EC2 returns the instance it already launched instead of a
second one. A node that has a live instance keeps it only as such a retry (its launch recorded,
no suspend.py running); else the instance is an earlier power-up's, which suspend.py is
terminating or failed to, and it is terminated and the node launched anew. The state file's lock
(a cluster manager pass may hold it) is waited for until a third of ResumeTimeout has passed
(LOCK_SHARE); not had by then, every node is set down at once. No launch is started once half of
ResumeTimeout has passed, less where it is short (launch_budget: EC2 throttling many launches one
after another): the nodes not reached are set down at once with the reason "not launched in
time". A launch whose instance is gone before it had an address is forgotten, or marked to be
forgotten where the lock is not had within FORGET_WAIT.

    resume.py NODELIST        e.g. resume.py gpu-[1-3]   (slurm.conf: ResumeProgram=...)
"""

import contextlib
import hashlib
import json
import logging
import os
import sys
import time
import uuid

from hpc_cloud import (CANNOT_CALL, CAPACITY_ERRORS, CLUSTER_TAG, CONTROLLER_TAG, EC2_NOT_HAD, JOB_CANNOT_START,
                       NO_ANSWER, NODE_TAG, NOT_IN_TIME, SPOT_REFUSED_ERRORS, STATE_LOCKED, NoAnswer, State,
                       StateBusy, aws_worst_case, cooldown_key, ec2_client, expand_hostlist, live_instances,
                       main_wrapper, mark_forgotten, market_cooldown_key, scontrol, set_down, suspend_running)

# What RunInstances creates and tags: the instance, its root volume, its network interface, and
# with spot its spot request. The IAM policy requires the cluster tag on each.
TAGGED_RESOURCES = ("instance", "volume", "network-interface")
# How long a new instance may take to get a private address that Slurm is told (seconds).
ADDRESS_TIMEOUT = 120
# The share of ResumeTimeout (cloud.json's resume_timeout_seconds, as slurm.conf's) that this
# program may spend, from its start, before it holds the state file's lock: another resume.py holds
# it while it launches (minutes where EC2 throttles a large power-up), a cluster manager pass only
# while it decides and records (it reads Slurm and EC2, and acts, without it). Not had by then,
# every node is set down at once with STATE_LOCKED's reason (not a failed boot; the cluster
# manager returns the nodes to service and Slurm requeues their jobs now), rather than launched so
# late that it cannot boot within ResumeTimeout, or left powering up until it: two thirds of
# ResumeTimeout are left for the launches and the boots (300 s: a lock had within 100 s).
LOCK_SHARE = 1 / 3
# The share of ResumeTimeout, from this program's start, within which a launch is started. Each
# launch may take its EC2 client's tries (EC2_DEADLINE) when EC2 throttles a burst of power-ups, and
# a run for many nodes launches them one after another: without a bound, its last nodes were
# launched after ResumeTimeout had passed (Slurm had set them down, a failed boot each, and their
# instances ran on as orphans). The nodes not reached by then are set down at once with
# NOT_IN_TIME's reason (not a failed boot; the cluster manager returns them to service).
LAUNCH_SHARE = 1 / 2
# Seconds the lock is waited for at least, however long EC2 took to be read before it.
LOCK_WAIT_MIN = 10
# Seconds the state file's lock is waited for at most, once the launches are done, to forget those
# of the nodes whose instances were terminated (an address never had): not had by then, they are
# marked to be forgotten (forget_launches).
FORGET_WAIT = 10
# Seconds an EC2 call may try (hpc_cloud.aws_client): long enough to ride out throttling of a
# burst of power-ups. An endpoint that never answers fails the first call within
# aws_worst_case(120) = 170 s and every later one at once, each node then set down with
# "resume failed: no answer from EC2: ...", well within hpc_cloud.RESUME_TIMEOUT_MIN.
EC2_DEADLINE = 120


def tags_for(cfg, node):
    return [{"Key": CLUSTER_TAG, "Value": cfg["cluster"]}, {"Key": NODE_TAG, "Value": node},
            {"Key": CONTROLLER_TAG, "Value": cfg["controller"]},
            {"Key": "Name", "Value": f"{cfg['cluster']}-{node}"}]


def request_for(cfg, node, choice, token):
    """The RunInstances request for one node and one choice (spot, instance type, subnet)."""
    spot, instance_type, subnet = choice
    # The on-demand fallback uses the on-demand template where the stack made one (the spot
    # template's market options cannot be switched off in the request).
    template = cfg["launch_template_id"] if spot else cfg.get("fallback_launch_template_id") or cfg["launch_template_id"]
    resources = TAGGED_RESOURCES + (("spot-instances-request",) if spot else ())
    request = {
        "LaunchTemplate": {"LaunchTemplateId": template, "Version": "$Latest"},
        "MinCount": 1,
        "MaxCount": 1,
        "ClientToken": token,
        "TagSpecifications": [{"ResourceType": r, "Tags": tags_for(cfg, node)} for r in resources],
    }
    if instance_type:
        request["InstanceType"] = instance_type
    if subnet:
        interface = {"DeviceIndex": 0, "SubnetId": subnet, "Groups": cfg["security_group_ids"]}
        if cfg["efa"]:
            interface["InterfaceType"] = "efa"
        request["NetworkInterfaces"] = [interface]
    if spot:
        request["InstanceMarketOptions"] = {
            "MarketType": "spot",
            "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
        }
    return request


def choices(cfg):
    """(spot, instance type or None, subnet or None), in the order they are tried. With EFA the
    first subnet only: the nodes share a cluster placement group, which lies in one zone (EC2
    refuses a launch into it from another zone's subnet)."""
    markets = [True, False] if cfg["market"] == "spot" and cfg["spot_fallback"] else [cfg["market"] == "spot"]
    subnets = cfg["subnet_ids"][:1] if cfg["efa"] else cfg["subnet_ids"]
    return [(spot, itype, subnet) for spot in markets for itype in cfg["instance_types"] or [None]
            for subnet in subnets or [None]]


def choice_token(base, choice):
    """ClientToken (at most 64 characters) of one node's power-up and one choice: a retry of the
    same request gets the same token; another choice a different one (EC2 refuses a token reused
    with other parameters)."""
    return hashlib.sha256(f"{base}|{choice}".encode()).hexdigest()[:64]


def subnet_zones(ec2, cfg):
    if not cfg["subnet_ids"]:
        return {}
    reply = ec2.describe_subnets(SubnetIds=cfg["subnet_ids"])
    return {s["SubnetId"]: s["AvailabilityZone"] for s in reply["Subnets"]}


def market_of(choice):
    return "spot" if choice[0] else "on-demand"


def available_choices(cfg, state, zones):
    """The choices not cooling down after a capacity error (theirs, or their whole market's), in
    order, with their cooldown keys."""
    found = []
    for choice in choices(cfg):
        _, itype, subnet = choice
        key = cooldown_key(itype, market_of(choice), zones.get(subnet, subnet))
        if not state.cooling(key) and not state.cooling(market_cooldown_key(market_of(choice))):
            found.append((choice, key))
    return found


def cool_down(cfg, state, key):
    state.cooldowns[key] = time.time() + cfg["capacity_cooldown_seconds"]
    logging.warning("%s disabled for %d s", key, cfg["capacity_cooldown_seconds"])


def ec2_reason(e):
    """Why an EC2 call failed, as a node's down reason says it (clustermgtd's failed_boot reads
    it): "CODE: message" for EC2's refusal, NO_ANSWER's words where EC2 did not answer (a
    timeout, hpc_cloud.NoAnswer), CANNOT_CALL's where the call never reached it, with what
    stopped it: no credentials, an endpoint not connected to, a setting that makes no client (an
    unknown profile)."""
    from botocore.exceptions import (ClientError, ConnectionClosedError, ConnectionError, ConnectTimeoutError,
                                     CredentialRetrievalError, NoCredentialsError, PartialCredentialsError,
                                     ReadTimeoutError)

    if isinstance(e, ClientError):
        error = e.response.get("Error", {})
        return f"{error.get('Code', '')}: {error.get('Message', '')}"
    if isinstance(e, (NoAnswer, ConnectTimeoutError, ReadTimeoutError, ConnectionClosedError)):
        return f"{NO_ANSWER}: {e}"
    if isinstance(e, (NoCredentialsError, PartialCredentialsError, CredentialRetrievalError)):
        return f"{CANNOT_CALL}: no AWS credentials: {e}"
    if isinstance(e, ConnectionError):
        return f"{CANNOT_CALL}: its endpoint not connected to: {e}"
    return f"{CANNOT_CALL}: {type(e).__name__}: {e}"


def launch_node(ec2, cfg, state, node, zones):
    """Launches `node`'s instance with the first choice that works; returns (RunInstances' answer
    for the instance or None, the reason none was launched)."""
    from botocore.exceptions import BotoCoreError, ClientError

    pending = state.launches.get(node)
    if not pending:
        pending = state.launches[node] = {"token": uuid.uuid4().hex, "at": time.time()}
    reason = "no capacity: every instance type, market and zone is disabled for a while after a capacity error"
    for choice, key in available_choices(cfg, state, zones):
        if state.cooling(market_cooldown_key(market_of(choice))):
            continue  # its market was refused by an earlier choice of this power-up
        try:
            reply = ec2.run_instances(**request_for(cfg, node, choice, choice_token(pending["token"], choice)))
        except BotoCoreError as e:
            # No answer (botocore has retried with the same token): the launch may have happened,
            # so the token is kept for the next try of this power-up.
            return None, ec2_reason(e)
        except ClientError as e:
            code = e.response.get("Error", {}).get("Code", "")
            reason = ec2_reason(e)
            logging.warning("%s: %s launch failed: %s", node, key, reason)
            if choice[0] and code in SPOT_REFUSED_ERRORS:
                logging.warning("spot is refused in this account (an administrator creates its role once: "
                                "aws iam create-service-linked-role --aws-service-name spot.amazonaws.com)")
                cool_down(cfg, state, market_cooldown_key("spot"))
                continue
            if code not in CAPACITY_ERRORS:
                state.launches.pop(node, None)  # refused: nothing was launched
                return None, reason  # not a capacity problem: another choice will not help
            cool_down(cfg, state, key)
            continue
        inst = reply["Instances"][0]
        if inst.get("State", {}).get("Name") in ("shutting-down", "terminated"):
            # The token answered with an earlier power-up's instance (its record outlived it):
            # forget it, so that the next try gets a new one.
            state.launches.pop(node, None)
            return None, f"launch token of a terminated instance {inst['InstanceId']}: retry"
        logging.info("%s: launched %s (%s)", node, inst["InstanceId"], key)
        return inst, ""
    state.launches.pop(node, None)  # every choice refused or cooling down: nothing was launched
    return None, reason


def jobs_of_nodes(path=None):
    """{node: {job id, ...}} from Slurm's job-to-node map (the JSON file SLURM_RESUME_FILE names:
    {"jobs": [{"job_id": 7, "nodes": "gpu-[1-2]"}, ...]} in Slurm 22.05, "nodes_alloc" from 23.02),
    or {} without one. A file that cannot be read or understood is said once and taken as none:
    the nodes are still launched, only not all or nothing."""
    path = path if path is not None else os.environ.get("SLURM_RESUME_FILE", "")
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            jobs = json.load(f)["jobs"]
        found = {}
        for job in jobs:
            nodes = job.get("nodes_alloc", job.get("nodes"))
            if not isinstance(nodes, str) or not isinstance(job["job_id"], int):
                raise ValueError(f"a job without a job_id or a node list: {job!r}"[:200])
            for node in expand_hostlist(nodes):
                found.setdefault(node, set()).add(job["job_id"])
        return found
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        logging.warning("SLURM_RESUME_FILE %s not understood (%s): every node is launched on its own", path, e)
        return {}


def resume(cfg, nodes, jobs=None):
    """Powers `nodes` up; `jobs`: {node: job ids} (jobs_of_nodes(), read here when None)."""
    from botocore.exceptions import BotoCoreError, ClientError
    start = time.monotonic()
    jobs = jobs_of_nodes() if jobs is None else jobs
    try:
        ec2 = ec2_client(cfg, EC2_DEADLINE)  # (an unknown AWS_PROFILE is refused here: ProfileNotFound)
        existing = live_instances(ec2, cfg, nodes)
        zones = subnet_zones(ec2, cfg)
    except (BotoCoreError, ClientError) as e:
        # Before any launch (EC2 throttled past the client's tries, no credentials, no client): every node
        # set down at once with EC2's reason, which the cluster manager returns to service and
        # counts as no failed boot, not left powering up until ResumeTimeout and counted.
        reason = ec2_reason(e)
        logging.error("%s: not launched: EC2's instances or subnets not read: %s", ",".join(nodes), reason)
        for node in nodes:
            set_down(node, f"resume failed: {reason}")
        return 1
    launched, failed = {}, 0
    late = []  # the nodes not launched because ResumeTimeout's share for the launches was spent
    unanswered = {}  # node -> why, of the nodes whose launch did not reach EC2 or got no answer: said in one line
    doomed = {}  # job id -> why it cannot start: a node of it got no instance

    def cannot_start(node):
        """Why `node` is not worth an instance: every job that needs it lost a node (or None)."""
        mine = jobs.get(node, ())
        return doomed[min(mine)] if mine and all(j in doomed for j in mine) else None

    with contextlib.ExitStack() as held:
        try:
            state = held.enter_context(State(cfg["state_file"], wait=lock_wait(cfg, start)))
        except StateBusy:
            return locked_out(cfg, nodes, start)
        # A live instance is this power-up's only when resume.py runs again for it (a retry: its
        # launch recorded, and no suspend.py running, which may not yet have forgotten an earlier
        # power-up's launch). Otherwise it is an earlier power-up's that suspend.py is terminating
        # (Slurm resumes a node SuspendTimeout after asking for its power-down, and suspend.py may
        # still be waiting for EC2) or failed to: taken, it would be terminated under the node.
        retry = not suspend_running(cfg["state_file"])
        leftovers = {node: existing.pop(node) for node in list(existing)
                     if node in nodes and not (retry and node in state.launches)}
        for node in leftovers:
            state.launches.pop(node, None)  # its token would answer with the old instance
        terminate_leftovers(ec2, leftovers)
        for node in nodes:
            if node in existing:  # asked twice (a retry): keep the instance it has
                launched[node] = existing[node][0]
                logging.info("%s: already has %s", node, launched[node]["InstanceId"])
                continue
            why = cannot_start(node)
            if why:
                failed += 1
                logging.warning("%s: not launched: %s", node, why)
                set_down(node, f"resume failed: {why}")
                continue
            spent = time.monotonic() - start
            if spent >= launch_budget(cfg):
                failed += 1
                late.append(node)
                reason = (f"{NOT_IN_TIME}: {spent:.0f} s of ResumeTimeout's {cfg['resume_timeout_seconds']:g} s"
                          " spent before it (EC2 slow or throttled)")
                set_down(node, f"resume failed: {reason}")
                for job in jobs.get(node, ()):
                    doomed.setdefault(job, f"{JOB_CANNOT_START} (job {job}: {node} got no instance)")
                continue
            instance, reason = launch_node(ec2, cfg, state, node, zones)
            if instance:
                launched[node] = instance
            else:
                failed += 1
                if reason.startswith(EC2_NOT_HAD):
                    unanswered[node] = reason
                set_down(node, f"resume failed: {reason}" if reason else "resume failed")
                for job in jobs.get(node, ()):
                    doomed.setdefault(job, f"{JOB_CANNOT_START} (job {job}: {node} got no instance)")
    if late:
        logging.error("%s: not launched: %s: no launch is started after %.0f s of ResumeTimeout's %g s",
                      ",".join(late), NOT_IN_TIME, launch_budget(cfg), cfg["resume_timeout_seconds"])
    if unanswered:  # (the client gives up for the run: every node after the first fails at once, alike)
        logging.error("%s: not launched: %s", ",".join(unanswered), next(iter(unanswered.values())))
    given_up = []
    for node, instance in list(launched.items()):
        why = cannot_start(node)
        if why:
            give_up(ec2, node, instance["InstanceId"], why)
            given_up.append(node)
            del launched[node]
    lost = register_addresses(ec2, launched) + given_up
    if lost:
        forget_launches(cfg, lost)
    return 1 if failed or lost else 0


def forget_launches(cfg, nodes):
    """Forgets the launches of `nodes`, whose instances are terminated (the next power-up is a new
    launch), waiting FORGET_WAIT seconds at most for the state file's lock: not had by then (a
    large power-up launching), they are marked to be forgotten by the next program that takes it
    (hpc_cloud.mark_forgotten, as suspend.py does), which a power-up of theirs, recorded after the
    mark, is not."""
    asked = time.time()
    try:
        with State(cfg["state_file"], wait=FORGET_WAIT) as state:
            for node in nodes:
                state.launches.pop(node, None)
    except StateBusy as e:
        try:
            mark_forgotten(cfg["state_file"], nodes, asked)
        except OSError as e2:
            logging.error("%s: launches not forgotten: %s, and no mark written: %s (their next power-up is set down "
                          "once, as a launch token of a terminated instance)", ",".join(nodes), e, e2)
            return
        logging.warning("%s: launches marked to be forgotten by the next program that takes the state file: %s",
                        ",".join(nodes), e)


def locked_out(cfg, nodes, start):
    """The state file's lock not had within lock_wait: every node set down at once (see LOCK_SHARE)."""
    # (Past LOCK_WAIT_MIN, a resume.py launching for minutes, above all: a pass holds it only to decide.)
    reason = (f"{STATE_LOCKED} for {time.monotonic() - start:.0f} s (held by another resume.py, suspend.py or a "
              "cluster manager pass)")
    logging.error("%s: not launched: %s; this program waits for it until a third of ResumeTimeout (%g s) has "
                  "passed", ",".join(nodes), reason, cfg["resume_timeout_seconds"])
    for node in nodes:
        set_down(node, f"resume failed: {reason}")
    return 1


def launch_budget(cfg):
    """Seconds from the start of the run within which a launch is started: LAUNCH_SHARE of
    ResumeTimeout, less where it is short, so that a launch started ends within it (with EC2
    throttling its tries: aws_worst_case(EC2_DEADLINE); 130 s of the shortest, 300 s)."""
    timeout = cfg["resume_timeout_seconds"]
    return min(LAUNCH_SHARE * timeout, timeout - aws_worst_case(EC2_DEADLINE))


def lock_wait(cfg, start):
    """Seconds left to wait for the state file's lock, of a run that started at `start` (monotonic):
    at least LOCK_WAIT_MIN (EC2 read slowly before it must not fail the power-up of a pass's moment)."""
    return max(LOCK_WAIT_MIN, LOCK_SHARE * cfg["resume_timeout_seconds"] - (time.monotonic() - start))


def terminate_leftovers(ec2, leftovers):
    """Terminates the instances of earlier power-ups ({node: [EC2's descriptions]}); one left
    running is the cluster manager's to terminate, as a second instance of its node."""
    from botocore.exceptions import BotoCoreError, ClientError

    ids = [i["InstanceId"] for found in leftovers.values() for i in found]
    if not ids:
        return
    for node, found in leftovers.items():
        logging.info("%s: a new launch; terminating %s of an earlier power-up", node,
                     ", ".join(i["InstanceId"] for i in found))
    try:
        ec2.terminate_instances(InstanceIds=ids)
    except (BotoCoreError, ClientError) as e:
        logging.error("cannot terminate %s: %s (the cluster manager terminates them as orphans)", ", ".join(ids), e)


def register_address(node, inst):
    """Gives Slurm the instance's private address, if `inst` (EC2's description of it) has one;
    whether Slurm took it."""
    ip = inst.get("PrivateIpAddress")
    if not ip:
        return False
    host = inst.get("PrivateDnsName") or ip
    if not scontrol("update", f"nodename={node}", f"nodeaddr={ip}", f"nodehostname={host.split('.')[0]}"):
        return False  # (slurmctld restarting, busy): asked again with the others still waiting
    logging.info("%s: %s at %s", node, inst["InstanceId"], ip)
    return True


def describe(ec2, instance):
    """EC2's description of one instance, or None while EC2 does not list it yet: its API is
    eventually consistent, and an instance just launched may be InvalidInstanceID.NotFound for a
    while ("Eventual consistency in the Amazon EC2 API"). Described one at a time, so that one
    instance not yet known does not hide the others."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        reply = ec2.describe_instances(InstanceIds=[instance])
    except ClientError as e:
        code = e.response.get("Error", {}).get("Code", "")
        if code != "InvalidInstanceID.NotFound":
            logging.warning("%s: DescribeInstances failed: %s", instance, e)
        return None
    except BotoCoreError as e:
        logging.warning("%s: DescribeInstances failed: %s", instance, e)
        return None
    return next((i for r in reply["Reservations"] for i in r["Instances"]), None)


def register_addresses(ec2, launched, timeout=ADDRESS_TIMEOUT):
    """Gives Slurm each new instance's private address: from RunInstances' answer (`launched`:
    {node: instance}; DescribeInstances' for an instance the node had already), which has it (the
    network interface is made with the instance), else from DescribeInstances, asked again with a
    growing pause while the instance is not yet known or has no address. A node still without one
    after `timeout` seconds is set down and its instance terminated (Slurm would otherwise wait
    ResumeTimeout for it, billed); so is one whose instance is already going. Returns those nodes."""
    waiting = {node: inst["InstanceId"] for node, inst in launched.items() if not register_address(node, inst)}
    lost = []
    deadline, pause = time.monotonic() + timeout, 1
    while waiting:
        for node, instance in list(waiting.items()):
            inst = describe(ec2, instance) or {"InstanceId": instance}
            status = inst.get("State", {}).get("Name")
            if status in ("shutting-down", "terminated"):
                why = inst.get("StateReason", {}).get("Message", "")
                give_up(ec2, node, instance, f"instance {instance} is {status}: {why}")
                lost.append(node)
                del waiting[node]
            elif register_address(node, inst):
                del waiting[node]
        if not waiting or time.monotonic() + pause > deadline:
            break
        time.sleep(pause)
        pause = min(2 * pause, 15)
    for node, instance in waiting.items():
        give_up(ec2, node, instance, f"instance {instance} has no address after {timeout} s")
        lost.append(node)
    return lost


def give_up(ec2, node, instance, reason):
    """Sets the node down (Slurm requeues its job) and terminates its instance."""
    from botocore.exceptions import BotoCoreError, ClientError

    logging.error("%s: %s", node, reason)
    try:
        ec2.terminate_instances(InstanceIds=[instance])
    except (BotoCoreError, ClientError) as e:  # the cluster manager terminates it as an orphan
        logging.error("%s: cannot terminate %s: %s", node, instance, e)
    set_down(node, f"resume failed: {reason}")


def set_down_all(nodes, why):
    """main_wrapper's on_failure: an error not foreseen sets every node asked for down at once,
    so that their jobs are requeued now, not after ResumeTimeout (the cluster manager powers them
    down, which terminates any instance launched before the error, and returns them to service)."""
    for node in nodes:
        set_down(node, f"resume failed: {why}")


if __name__ == "__main__":
    sys.exit(main_wrapper("resume.py", resume, set_down_all))

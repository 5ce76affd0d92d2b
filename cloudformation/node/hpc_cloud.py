"""What the head node's cloud programs share (resume.py, suspend.py, resume_fail.py and the
cluster manager clustermgtd.py): the cluster's settings, Slurm host lists, scontrol, the EC2
instances that stand for Slurm nodes, and the small state they keep between runs.

Every compute instance carries the tags hpctrain:cluster (the stack's name: unique among the
account's stacks in the region, and what the IAM policies match), hpctrain:node (the Slurm node
it stands for) and hpctrain:controller (where its slurmd finds slurmctld). The settings come from
a JSON file that the head node's bootstrap writes (HPCTRAIN_CLOUD_CONFIG, default
/etc/hpctrain/cloud.json):

  {"cluster": "STACK", "region": "us-east-1",
   "launch_template_id": "lt-...", "fallback_launch_template_id": "lt-..." (on-demand, spot's fallback),
   "instance_profile_arn": "arn:aws:iam::ACCOUNT:instance-profile/..."  the templates' instance profile:
                                             only instances with it are the cluster's (see live_instances),
   "instance_types": ["g5.12xlarge", ...]   in order of preference (empty: the template's),
   "subnet_ids": ["subnet-...", ...]         in order of preference (empty: the template's network),
   "security_group_ids": ["sg-..."], "efa": false,
   "market": "spot" | "on-demand", "spot_fallback": true,
   "capacity_cooldown_seconds": 600, "orphan_grace_seconds": 300,
   "resume_timeout_seconds": 300             slurm.conf's ResumeTimeout (default, and the least: the stack's least),
   "protected_failure_count": 10             failed boots in a row that stop a partition (0: never),
   "controller": "HOST" (default: this host's name),
   "state_file": "/var/lib/hpctrain/cloud-state.json",
   "heartbeat_file": "/shared/.hpctrain/clustermgtd.heartbeat",
   "log_file": "/var/log/hpctrain/power.log"}
"""

import argparse
import contextlib
import fcntl
import json
import logging
import math
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

CLUSTER_TAG = "hpctrain:cluster"
NODE_TAG = "hpctrain:node"
CONTROLLER_TAG = "hpctrain:controller"
# The reasons this cluster's own programs give when they set a node down or drain it: the cluster
# manager returns such nodes to service, and never a node drained for any other reason (an
# administrator's). Slurm's own reasons for a cloud node that failed are included.
OWN_REASON_PREFIX = "hpctrain: "
SLURM_FAILURE_REASONS = ("Not responding", "ResumeTimeout reached", "Node unexpectedly rebooted",
                         "Kill task failed", "Prolog error", "Epilog error", "batch job complete failure")
# Instance states in which an instance still stands for its node (or costs money). Not
# "shutting-down": such an instance is on its way to terminated and never runs again, so its node
# needs a new one (resume.py launches it) and there is nothing left to terminate. (The stack's
# cleanup handler, which must wait until the network interfaces are gone, counts it as not yet gone.)
LIVE_STATES = ["pending", "running", "stopping", "stopped"]
# EC2 errors that mean "no capacity for this request now": spot falls back to on-demand on
# these, and a node that gets none is set down with the reason.
CAPACITY_ERRORS = {
    "InsufficientInstanceCapacity",
    "InsufficientCapacity",
    "SpotMaxPriceTooLow",
    "MaxSpotInstanceCountExceeded",
    "InstanceLimitExceeded",
    "VcpuLimitExceeded",
    "Unsupported",
    # The subnet has no address left: another zone's subnet may (the next choice).
    "InsufficientFreeAddressesInSubnet",
}
# EC2 errors that say nothing of the node or its boot: EC2 throttled the account's calls, or
# failed itself, after botocore's own retries (ec2_client). A node set down for one is returned to
# service by the cluster manager like any other, but is not a failed boot toward protected mode:
# a burst of power-ups (hundreds of nodes at once) must not stop a partition whose boots are fine.
TRANSIENT_ERRORS = {"RequestLimitExceeded", "Throttling", "ServiceUnavailable", "Unavailable", "InternalError"}
# EC2 errors that refuse a launch for want of permission (the head node's policy, an organization's
# service control policy, a key's policy): nothing was launched or billed, and launch_check.py asks
# for every launch at creation and after each update, reporting a refusal. Not a failed boot toward
# protected mode: a stack update that changes ComputeInstanceTypes (or the compute subnets) changes
# the head node's policy at once, but cloud.json only when cfn-hup next polls (every 5 minutes), and
# the power-ups in between, of the old choices, are refused; counted, they could stop a partition.
REFUSED_ERRORS = {"UnauthorizedOperation"}
# resume.py's reason when EC2 did not answer at all (a timeout, the connection closed)...
NO_ANSWER = "no answer from EC2"
# ... and when the call never reached EC2: no credentials, a profile or an endpoint setting that
# makes no client, an endpoint that cannot be connected to (not resolved, refused, TLS failed).
CANNOT_CALL = "cannot call EC2"
# The reasons that say nothing of a node or its boot, only that EC2 was not had: not a failed boot.
EC2_NOT_HAD = (NO_ANSWER, CANNOT_CALL)
# resume.py's reason when the state file stayed locked (another resume.py launching, suspend.py or a
# cluster manager pass held it) for longer than its nodes' ResumeTimeout allows: nothing of the
# node's either.
STATE_LOCKED = "the state file stayed locked"
# resume.py's reason for a node whose launch was not started within its share of ResumeTimeout
# (LAUNCH_SHARE), the launches before it slow (EC2 throttling them, each with its client's tries):
# nothing of the node's either.
NOT_IN_TIME = "not launched in time"
# The reason of a node whose job lost another node's launch: all or nothing (resume.py); what it
# says is of the job, not of the node or its boot.
JOB_CANNOT_START = "its job cannot start"
# EC2 errors that refuse spot itself, in every zone and for every instance type: spot falls back to
# on-demand on these, and the whole spot market cools down (market_cooldown_key), not one choice.
# AuthFailure.ServiceLinkedRoleCreationNotPermitted: the account has no AWSServiceRoleForEC2Spot
# (a fresh account that never launched spot) and the head node's role may not create it (it
# should not: iam:CreateServiceLinkedRole). As AWS ParallelCluster's troubleshooting guide shows it
# in slurm_resume.log, and the EC2 user guide's "Service-linked role for Spot Instance requests";
# an administrator creates the role once: aws iam create-service-linked-role --aws-service-name spot.amazonaws.com
SPOT_REFUSED_ERRORS = {
    "AuthFailure.ServiceLinkedRoleCreationNotPermitted",
}
# The shortest ResumeTimeout the stack takes (cluster.yaml's ResumeTimeoutSeconds: MinValue), in
# which resume.py must have set every node it could not launch down; cloud.json's
# resume_timeout_seconds may be no less.
RESUME_TIMEOUT_MIN = 300
# Seconds a Slurm command (sinfo, scontrol) may take before it is killed: resume.py runs some
# holding the state file's lock, and a hung slurmctld must not hold every other program behind it
# for ever (nor a cluster manager pass past its unit's timeout).
SLURM_TIMEOUT = 60


class OneLineParser(argparse.ArgumentParser):
    """argparse with bad input reported as one line ("PROG: error: ...") and exit code 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


class ConfigError(Exception):
    """The settings file is missing or malformed."""


def aws_region(text):
    """`text` if it has the shape of an AWS region's name (us-east-1, us-gov-west-1, ap-southeast-2),
    else ValueError: botocore refuses some malformed names only when a client is made, with a
    traceback in the programs that make one first, and takes others (us_east_1) for a host name."""
    if not isinstance(text, str) or not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d{1,2}", text):
        raise ValueError(f"{text!r} is not an AWS region (like us-east-1)")
    return text


def region_arg(text):
    """aws_region for argparse: a malformed --region is a usage error (one line, exit 2)."""
    try:
        return aws_region(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def load_config(path=None):
    path = path or os.environ.get("HPCTRAIN_CLOUD_CONFIG", "/etc/hpctrain/cloud.json")
    try:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}") from e
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not JSON: {e}") from e
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path} must hold a JSON object")
    for key in ("cluster", "region", "launch_template_id"):
        if not isinstance(cfg.get(key), str) or not cfg[key]:
            raise ConfigError(f"{path}: '{key}' must be a non-empty string")
    try:
        aws_region(cfg["region"])
    except ValueError as e:
        raise ConfigError(f"{path}: 'region': {e}") from None
    for key, what in (("subnet_ids", "subnet ids"), ("instance_types", "instance types"),
                      ("security_group_ids", "security group ids")):
        values = cfg.setdefault(key, [])
        if not isinstance(values, list) or not all(isinstance(v, str) and v for v in values):
            raise ConfigError(f"{path}: '{key}' must be a list of {what}")
    profile = cfg.setdefault("instance_profile_arn", None)
    is_arn = isinstance(profile, str) and re.fullmatch(r"arn:[\w-]+:iam::\d{12}:instance-profile/\S+", profile)
    if profile is not None and not is_arn:
        raise ConfigError(f"{path}: 'instance_profile_arn' must be an instance profile's ARN, not {profile!r}")
    market = cfg.setdefault("market", "on-demand")
    if not isinstance(market, str) or market not in ("spot", "on-demand"):
        raise ConfigError(f"{path}: 'market' must be 'spot' or 'on-demand', not {market!r}")
    # Seconds, each with the least it may be. ResumeTimeout: the stack's least (cluster.yaml's
    # MinValue), within which resume.py's launches are planned (resume.launch_budget: a launch is
    # started only while EC2's worst case, 170 s, still ends within it); under 170 s no node was ever
    # launched, each set down as "not launched in time: 0 s ... spent (EC2 slow or throttled)".
    for key, default, least in (("capacity_cooldown_seconds", 600, 0), ("orphan_grace_seconds", 300, 0),
                                ("resume_timeout_seconds", 300, RESUME_TIMEOUT_MIN)):
        value = cfg.setdefault(key, default)
        if not _number(value) or not math.isfinite(value) or value < least:
            why = " (cluster.yaml's least ResumeTimeoutSeconds, which resume.py plans its launches in)" if least else ""
            raise ConfigError(f"{path}: '{key}' must be a number of seconds, {least} or more{why}, not {value!r}")
    # What Slurm is told of every compute node (slurm.conf's CPUs, Gres and RealMemory), which
    # launch_check.py holds each instance type to; absent: not checked.
    shape = cfg.setdefault("node_shape", None)
    if shape is not None:
        least = {"cpus": 1, "gpus": 0, "memory_mib": 1}
        if not isinstance(shape, dict) or sorted(shape) != sorted(least) or not all(
                isinstance(shape[k], int) and not isinstance(shape[k], bool) and shape[k] >= least[k] for k in least):
            raise ConfigError(f"{path}: 'node_shape' must be {{\"cpus\": N >= 1, \"gpus\": N >= 0, "
                              f"\"memory_mib\": N >= 1}}, not {shape!r}")
    count = cfg.setdefault("protected_failure_count", 10)
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise ConfigError(f"{path}: 'protected_failure_count' must be a whole number, 0 or more, not {count!r}")
    # JSON's true or false only: the string "false" is true to Python, and was taken for it.
    for key, default in (("spot_fallback", True), ("efa", False)):
        if not isinstance(cfg.setdefault(key, default), bool):
            raise ConfigError(f"{path}: '{key}' must be true or false (JSON, unquoted), not {cfg[key]!r}")
    # Absent or null (or "" where it means the default or none): the default; given: a non-empty
    # string (a number or a list would fail a run later, or name a file "5").
    for key, default in (("controller", None), ("fallback_launch_template_id", None), ("log_file", None),
                         ("state_file", "/var/lib/hpctrain/cloud-state.json"),
                         ("heartbeat_file", "/shared/.hpctrain/clustermgtd.heartbeat")):
        if cfg.get(key) is None or (cfg[key] == "" and key in ("controller", "log_file")):
            cfg[key] = default
        elif not isinstance(cfg[key], str) or not cfg[key]:
            raise ConfigError(f"{path}: '{key}' must be a non-empty string, not {cfg[key]!r}")
    if not cfg["controller"]:
        cfg["controller"] = socket.getfqdn()
    return cfg


# The most node names a host list may expand to: far more than a cluster has (cluster.yaml allows
# 512 compute nodes), so that a typo (gpu-[1-10000000]) is one error line, not minutes of memory.
MAX_HOSTLIST_NAMES = 65536


def expand_hostlist(text):
    """Slurm's compressed host list, as ResumeProgram gets it: 'gpu-[1-3,7],cpu-1' ->
    ['gpu-1', 'gpu-2', 'gpu-3', 'gpu-7', 'cpu-1']. Zero padding is kept (n[01-02]). White space
    (a list typed as 'gpu-1, gpu-2') is refused: no node's name holds it."""
    items, depth, start = [], 0, 0
    text = text or ""
    if re.search(r"[\s\x00-\x1f]", text):
        raise ValueError(f"not a Slurm host list (it holds white space): {text!r}")
    for i, c in enumerate(text):
        depth += (c == "[") - (c == "]")
        if depth not in (0, 1):
            raise ValueError(f"not a Slurm host list: {text!r}")
        if c == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    if depth != 0 or any(not item for item in items):
        raise ValueError(f"not a Slurm host list: {text!r}")
    names = []
    for item in items:
        m = re.fullmatch(r"([^\[\]]*)\[([^\]]+)\]([^\[\]]*)", item)
        if not m:
            if "[" in item or "]" in item:
                raise ValueError(f"not a Slurm host list: {text!r}")
            names.append(item)
            continue
        prefix, ranges, suffix = m.groups()
        for part in ranges.split(","):
            bounds = part.split("-")
            if len(bounds) == 1 and bounds[0].isdigit():
                names.append(prefix + bounds[0] + suffix)
            elif len(bounds) == 2 and all(b.isdigit() for b in bounds) and int(bounds[0]) <= int(bounds[1]):
                if len(names) + int(bounds[1]) - int(bounds[0]) + 1 > MAX_HOSTLIST_NAMES:
                    raise ValueError(f"more than {MAX_HOSTLIST_NAMES} node names in {text!r}"[:300])
                width = len(bounds[0])
                for i in range(int(bounds[0]), int(bounds[1]) + 1):
                    names.append(f"{prefix}{i:0{width}d}{suffix}")
            else:
                raise ValueError(f"not a Slurm host list: {text!r}")
    if not names:
        raise ValueError(f"no node names in {text!r}")
    return names


def scontrol(*args, timeout=None):
    """Runs scontrol (the one on PATH), killed after `timeout` seconds (default SLURM_TIMEOUT); an
    error is logged, not raised: one node's failure must not stop the others from being handled."""
    cmd = ["scontrol", *args]
    timeout = SLURM_TIMEOUT if timeout is None else timeout
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        logging.error("%s failed: no answer within %g s (slurmctld hung?)", " ".join(cmd), round(timeout, 1))
        return False
    if r.returncode != 0:
        logging.error("%s failed (%d): %s", " ".join(cmd), r.returncode, r.stderr.strip())
    return r.returncode == 0


def set_down(node, reason):
    """Takes a node down with a reason (marked as this cluster's own, so that the cluster manager
    returns the node to service): Slurm requeues its job."""
    return scontrol("update", f"nodename={node}", "state=down", f"reason={OWN_REASON_PREFIX}{reason}"[:200])


def is_own_reason(reason):
    """Whether a node's down or drain reason is this cluster's or Slurm's own (not an administrator's)."""
    return reason.startswith(OWN_REASON_PREFIX) or reason.startswith(SLURM_FAILURE_REASONS)


# Every AWS call of the node programs is bounded (aws_client), so that an endpoint that accepts
# the connection and never answers, or never accepts it, cannot hold a program past the interval
# of whoever runs it: botocore's own defaults (60 s to connect, 60 s for each read, and with
# ec2_client's 10 tries) would hold a ResumeProgram, SuspendProgram or cluster manager pass for
# up to ~20 minutes. Seconds to open a connection, seconds each read of the answer may wait:
AWS_CONNECT_TIMEOUT = 5
AWS_READ_TIMEOUT = 20
# The "standard" retry mode's longest pause between two tries: 20 s, and 5 s more where an answer
# asks for it (x-amz-retry-after).
AWS_MAX_PAUSE = 25


class NoAnswer(Exception):
    """An AWS endpoint gave no answer within a call's deadline (aws_client); a BotoCoreError (below),
    so that every program's handling of botocore's own no-answer errors handles it too."""


def aws_worst_case(deadline):
    """The longest an AWS call of aws_client(..., deadline) may take, in seconds: a try is started
    only before `deadline` (connect + one read at most), then botocore's pause before the next
    try, which aws_client refuses."""
    return deadline + AWS_CONNECT_TIMEOUT + AWS_READ_TIMEOUT + AWS_MAX_PAUSE


def aws_client(service, region, deadline, attempts=3, give_up_for_the_run=True):
    """A boto3 client whose every call takes at most aws_worst_case(deadline) seconds: each try
    connects within AWS_CONNECT_TIMEOUT and waits at most AWS_READ_TIMEOUT for each read, tries
    (up to `attempts`, "standard" retry mode: throttling and the service's own failures retried
    with backoff) start only within `deadline` seconds of the call, and a call past it fails with
    NoAnswer, whose text names the endpoint and its last try. Nothing is logged here: the caller's
    own error line, which says what the failure means (the nodes set down, the key not fetched)
    and carries the NoAnswer's text, is the one line of it (with a line here too, every program
    said it twice). With
    give_up_for_the_run (the programs that run once: resume.py, suspend.py, a cluster manager
    pass), every later call of the client then fails at once with NoAnswer, instead of each
    waiting its own worst case (resume.py's nodes, one RunInstances each, would add up): the
    program takes its documented failure path (the nodes set down, the instances left to the
    cluster manager, the next pass) within one call's worst case."""
    import boto3  # imported here so that --help and the host list work without boto3

    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ConnectionError, HTTPClientError

    class NoAnswerError(NoAnswer, BotoCoreError):
        fmt = "{endpoint} gave no answer within {seconds:g} s ({why})"

    client = boto3.client(service, region_name=region, config=Config(
        connect_timeout=AWS_CONNECT_TIMEOUT, read_timeout=AWS_READ_TIMEOUT,
        retries={"mode": "standard", "total_max_attempts": attempts}))
    endpoint = client.meta.endpoint_url
    call = {"start": 0.0, "given_up": None, "last": "no try"}

    def give_up(why):
        if call["given_up"] is None:
            call["given_up"] = why

    def before_call(**_):
        call["start"], call["last"] = time.monotonic(), "no try"
        if call["given_up"] is not None and not give_up_for_the_run:
            call["given_up"] = None
        if call["given_up"] is not None:
            raise NoAnswerError(endpoint=endpoint, seconds=deadline, why=call["given_up"])

    def before_send(**_):
        if time.monotonic() - call["start"] > deadline:
            give_up(call["last"])
            raise NoAnswerError(endpoint=endpoint, seconds=deadline, why=call["last"])

    def needs_retry(caught_exception=None, response=None, **_):
        if caught_exception is not None:
            call["last"] = f"last try: {type(caught_exception).__name__}: {caught_exception}"
        elif response is not None:
            code = response[1].get("Error", {}).get("Code", "") if isinstance(response[1], dict) else ""
            call["last"] = f"last try: {code or 'answered'}"

    def after_call_error(exception=None, **_):
        if isinstance(exception, (ConnectionError, HTTPClientError)):  # (not NoCredentialsError and such)
            give_up(f"{type(exception).__name__}: {exception}")

    client.meta.events.register("before-call", before_call)
    client.meta.events.register("before-send", before_send)
    client.meta.events.register("needs-retry", needs_retry)
    client.meta.events.register("after-call-error", after_call_error)
    return client


# The deadline of an EC2 call, in seconds, unless a program names its own (resume.py and
# suspend.py do, from their Slurm timeouts): the cluster manager's pass may take 5 minutes
# (bootstrap_head.sh: TimeoutStartSec=5min) and makes EC2 calls and one CloudWatch call, each
# client giving up for the pass after one call without an answer: 2 x aws_worst_case(60) = 220 s.
EC2_DEADLINE = 60


def ec2_client(cfg, deadline=EC2_DEADLINE):
    # The "standard" retry mode, 10 tries in all rather than its default 3: throttling (RequestLimitExceeded)
    # and EC2's own failures are retried with backoff, and a power-up of many nodes at once (each
    # a RunInstances) rides out a burst instead of failing it, for as long as `deadline` allows.
    return aws_client("ec2", cfg["region"], deadline, attempts=10)


def live_instances(ec2, cfg, nodes=None):
    """{node name: [EC2's descriptions of its instances]} of the cluster's live instances (of
    `nodes` only, if given). Asked by the cluster's tag only, the nodes picked here: AWS refuses a
    filter of more than 200 values (FilterLimitExceeded; moto takes any number), Slurm may pass
    more nodes than that, and the cluster has no more instances than its nodes, so one paged
    request reads them all.

    With instance_profile_arn set (the head node's cloud.json sets it), an instance counts only if
    it has that profile, the one the launch templates give: tags can be put on any instance by
    whoever may call ec2:CreateTags, a profile only by whoever may pass the compute role. The head
    node's role may terminate only instances with that profile, and EC2 refuses a TerminateInstances
    call whole when it may not terminate one of its instances: an instance tagged for the cluster
    by someone else would otherwise stop suspend.py and the cluster manager from terminating the
    cluster's own (left running, billed). Such an instance is logged and left alone. (Filtered
    here, not by the describe filter iam-instance-profile.arn, which moto does not have.)"""
    wanted = set(nodes) if nodes else None
    profile = cfg.get("instance_profile_arn")
    filters = [
        {"Name": f"tag:{CLUSTER_TAG}", "Values": [cfg["cluster"]]},
        {"Name": "instance-state-name", "Values": LIVE_STATES},
    ]
    found = {}
    for page in ec2.get_paginator("describe_instances").paginate(Filters=filters):
        for reservation in page["Reservations"]:
            for inst in reservation["Instances"]:
                node = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}.get(NODE_TAG)
                if node is None or (wanted is not None and node not in wanted):
                    continue
                has = inst.get("IamInstanceProfile", {}).get("Arn")
                if profile and has != profile:
                    logging.warning("%s is tagged as node %s of this cluster but has %s, not the cluster's %s: "
                                    "not the cluster's, left alone", inst["InstanceId"], node,
                                    f"the instance profile {has}" if has else "no instance profile", profile)
                    continue
                found.setdefault(node, []).append(inst)
    return found


def instances_of(ec2, cfg, nodes=None):
    """{node name: [instance ids]} of the cluster's live instances (of `nodes` only, if given)."""
    return {node: [i["InstanceId"] for i in insts] for node, insts in live_instances(ec2, cfg, nodes).items()}


def _number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# Each section of the state file and what each of its entries must be. The file is this cluster's
# own, but a hand edit, a downgrade or a bug can leave an entry of another shape, and one such
# entry would fail every run that reads it: the cluster manager would terminate no orphan again,
# resume.py would leave its nodes powering up until ResumeTimeout.
STATE_SHAPES = {
    "cooldowns": _number,  # until
    "launches": lambda v: (isinstance(v, dict) and isinstance(v.get("token"), str) and bool(v["token"])
                           and _number(v.get("at"))),
    "boot_failures": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
    "counted_failures": lambda v: isinstance(v, str),
    "protected": lambda v: (isinstance(v, dict) and _number(v.get("since")) and isinstance(v.get("nodes"), list)
                            and all(isinstance(n, str) for n in v["nodes"])),
}


class StateBusy(Exception):
    """The state file's lock was not had within a State's `wait` seconds."""


def forget_marks_dir(state_file):
    return state_file + ".forget"


def mark_forgotten(state_file, nodes, asked):
    """For suspend.py when it gives up waiting for the state file's lock: the launches of `nodes`
    recorded at or before `asked` (when their power-down was asked) are forgotten by the next
    program that holds the lock (State applies the mark), as suspend.py would have forgotten them.
    Without it a resume.py that came before the cluster manager's next pass would take the node's
    old instance, left running, for a retry of its own launch. Written without the lock: one file
    per mark, whole or not at all (write_atomically)."""
    directory = forget_marks_dir(state_file)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    write_atomically(os.path.join(directory, f"{time.time_ns()}-{os.getpid()}.json"),
                     json.dumps({"asked": asked, "nodes": list(nodes)}), 0o644)


def open_lock(path):
    """The lock file `path` (made if missing), opened for flock: 0600, this program's user's alone,
    whatever the umask, and one made looser before (0644) is made so. A lock file others can open,
    if only to read, is one they can flock: any user on the head node held the state file's lock
    (every resume.py then set its nodes down), suspend.py's (no launch was then taken for a
    retry) or the cluster manager's (each pass said "another pass is running", and none ran)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        if os.fstat(fd).st_mode & 0o077:
            # (Another user's: left to its owner; a file system that takes no modes, some FUSE
            # mounts' ENOTSUP: the lock works as before.)
            with contextlib.suppress(OSError):
                os.fchmod(fd, 0o600)
        return os.fdopen(fd, "a", encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise


def take_lock(lock, wait):
    """An exclusive flock on the open file `lock`, waited for without a bound (wait None) or for at
    most `wait` seconds; whether it was had."""
    if wait is None:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return True
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(0.2, left))


class State:
    """What the programs remember between runs, in one JSON file (state_file) on the head node's
    own disk: capacity cooldowns {"TYPE|MARKET|ZONE": until} ("*|spot|*": the whole spot market),
    each node's pending launch {"NODE": {"token": ClientToken base, "at": time, "up": whether it
    came up}}, and the cluster manager's protected mode: failed boots in a row per partition
    {"PARTITION": count}, the nodes whose failed boot is counted {"NODE": reason}, and the
    partitions in protected mode {"PARTITION": {"since": time, "nodes": [the nodes it set down]}}.
    A section or an entry of another shape (STATE_SHAPES) is dropped on reading, with one warning.
    Used as `with State(path) as st:`, which holds an exclusive lock (resume.py, suspend.py and the
    cluster manager may run at once) and writes the file back atomically when the block ends
    without an exception. With `wait` (seconds), a lock not had by then raises StateBusy. The
    launches that suspend.py marked to forget (mark_forgotten) are forgotten on entering, and the
    marks removed once the file is written back."""

    def __init__(self, path, wait=None):
        self.path = path
        self.wait = wait
        self.data = {}
        self._lock = None
        self._marks = []

    def __enter__(self):
        os.makedirs(os.path.dirname(self.path) or ".", mode=0o755, exist_ok=True)
        self._lock, self._marks = open_lock(self.path + ".lock"), []
        if not take_lock(self._lock, self.wait):
            self._lock.close()
            raise StateBusy(f"the state file {self.path} stayed locked for {self.wait:g} s (resume.py, "
                            "suspend.py or a cluster manager pass holds it)")
        self.data = read_state(self.path)
        self._forget_marked()
        return self

    def _forget_marked(self):
        """Applies suspend.py's marks (mark_forgotten); a mark of another shape is dropped with a warning."""
        directory = forget_marks_dir(self.path)
        try:
            names = sorted(n for n in os.listdir(directory) if not n.startswith("."))  # (not one being written)
        except FileNotFoundError:
            return
        for name in names:
            path = os.path.join(directory, name)
            try:
                with open(path, encoding="utf-8") as f:
                    mark = json.load(f)
                asked, nodes = mark["asked"], mark["nodes"]
                if not _number(asked) or not isinstance(nodes, list):
                    raise ValueError(f"not a mark: {mark!r}"[:200])
            except (OSError, ValueError, KeyError, TypeError) as e:
                logging.warning("forget mark %s unreadable (%s): dropped", path, e)
                self._marks.append(path)
                continue
            for node in nodes:
                if isinstance(node, str) and self.launches.get(node, {}).get("at", 0) <= asked:
                    self.launches.pop(node, None)  # (one launched after the power-down was asked is kept)
            self._marks.append(path)

    def __exit__(self, kind, value, tb):
        try:
            if kind is None:
                write_atomically(self.path, json.dumps(self.data, indent=1, sort_keys=True), 0o600)
                for path in self._marks:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
        finally:
            self._lock.close()
        return False

    @property
    def cooldowns(self):
        return self.data["cooldowns"]

    @property
    def launches(self):
        return self.data["launches"]

    @property
    def boot_failures(self):
        return self.data["boot_failures"]

    @property
    def counted_failures(self):
        return self.data["counted_failures"]

    @property
    def protected(self):
        return self.data["protected"]

    def cooling(self, key, now=None):
        """Whether the choice `key` is disabled after a capacity error, until when."""
        until = self.cooldowns.get(key, 0)
        return until if until > (now or time.time()) else 0


def read_state(path, warn=logging.warning):
    """The state file's content as State holds it: a JSON object whose every section of
    STATE_SHAPES is a dict of entries of that section's shape. A file that is not there is {}; one
    that cannot be read or is no JSON object is {} too, and a section or entry of another shape is
    dropped, each said through `warn` (logging's arguments)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        data = {}
    except (OSError, ValueError) as e:  # a damaged file (cut JSON, not UTF-8) costs only what it remembered
        warn("state file %s unreadable (%s): starting afresh", path, e)
        data = {}
    if not isinstance(data, dict):
        warn("state file %s holds no JSON object: starting afresh", path)
        data = {}
    dropped = []
    for key, valid in STATE_SHAPES.items():
        section = data.get(key, {})
        if not isinstance(section, dict):
            dropped.append(key)
            section = {}
        for name in [n for n, value in section.items() if not valid(value)]:
            del section[name]
            dropped.append(f"{key}[{name!r}]")
        data[key] = section
    if dropped:
        warn("state file %s: dropped what has the wrong shape: %s", path, ", ".join(dropped))
    return data


def peek_launches(state_file):
    """The launches recorded in the state file as last written, read without its lock (for the
    cluster manager, before it reads Slurm and EC2): the file is replaced whole (write_atomically),
    so this is what the last program that held the lock left. {} where it cannot be read; entries
    of the wrong shape (STATE_SHAPES) left out, in silence (the pass's State says so). Forget marks
    are not applied."""
    return read_state(state_file, warn=lambda *args: None)["launches"]


@contextlib.contextmanager
def suspending(state_file):
    """Held (a shared lock on a file beside the state file) for as long as suspend.py runs, from
    before it waits for the state file's lock: resume.py asks suspend_running() whether the
    launch records it reads may be an earlier power-up's that suspend.py has yet to forget."""
    os.makedirs(os.path.dirname(state_file) or ".", mode=0o755, exist_ok=True)
    with open_lock(state_file + ".suspend.lock") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        yield


def suspend_running(state_file):
    """Whether a suspend.py holds suspending() now."""
    os.makedirs(os.path.dirname(state_file) or ".", mode=0o755, exist_ok=True)
    with open_lock(state_file + ".suspend.lock") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False


def write_atomically(path, data, mode, owner=None):
    """`data` (text or bytes) into `path` at once, with `mode` (and `owner`, a (uid, gid), if
    given) before it is in place: a reader, or a kill midway, sees the old file or the whole new
    one, never half of it, and never a moment of looser permissions. On the disk before the rename,
    and the rename on it before the return: a head node that lost power just after could otherwise
    come back with an empty state file (its launches' ClientTokens, cooldowns and protected mode
    forgotten) or munge key."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        if owner is not None:
            os.chown(tmp, *owner)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def cooldown_key(instance_type, market, zone):
    return f"{instance_type or 'template'}|{market}|{zone or 'template'}"


def market_cooldown_key(market):
    """The key that disables a whole market (every instance type, every zone)."""
    return f"*|{market}|*"


def setup_logging(cfg, program):
    """Log lines to standard error and to the configuration's log_file (the power log, which the
    CloudWatch agent sends to the log group). A log file that cannot be opened (another user's:
    bootstrap_head.sh makes it Slurm's user's before any program runs) is said on standard error,
    where its lines then go alone: they were lost without a word."""
    handlers = [logging.StreamHandler(sys.stderr)]
    log_file = cfg.get("log_file") if cfg else None
    unwritable = None
    if log_file:
        try:
            os.makedirs(os.path.dirname(log_file), exist_ok=True)
            handlers.append(logging.FileHandler(log_file))
        except OSError as e:
            unwritable = e.strerror or str(e)
    logging.basicConfig(level=logging.INFO, handlers=handlers, force=True,
                        format=f"%(asctime)s {program}: %(levelname)s: %(message)s")
    logging.getLogger("botocore").setLevel(logging.WARNING)  # not its "Found credentials" on every run
    if unwritable:
        logging.warning("cannot write the log file %s (%s): this run's lines go to standard error alone",
                        log_file, unwritable)


def main_wrapper(program, body, on_failure=None):
    """Runs body(cfg, nodes) for `program NODELIST`, turning bad input into one error line and
    exit code 2, and any other error (a bug, an answer of a shape not foreseen) into one line in
    the log and exit code 1, after on_failure(nodes, why) if given (resume.py sets its nodes down,
    rather than leave them powering up until ResumeTimeout)."""
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print(f"usage: {program} NODELIST   (a Slurm host list, as slurmctld passes it)", file=sys.stderr)
        return 0 if len(sys.argv) == 2 else 2
    try:
        cfg = load_config()
        nodes = expand_hostlist(sys.argv[1])
    except (ConfigError, ValueError) as e:
        print(f"{program}: error: {e}", file=sys.stderr)
        return 2
    setup_logging(cfg, program)
    try:
        return body(cfg, nodes)
    except Exception as e:  # noqa: BLE001 - one line in the log file: slurmctld keeps none of these programs' output
        why = f"{type(e).__name__}: {e}"
        logging.error("%s failed: %s", sys.argv[1], why)
        if on_failure is not None:
            try:
                on_failure(nodes, why)
            except Exception as e2:  # noqa: BLE001 - the line above is said; this one too, and the exit
                logging.error("and then: %s: %s", type(e2).__name__, e2)
        return 1

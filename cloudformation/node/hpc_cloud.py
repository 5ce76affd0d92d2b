"""What the head node's Slurm power-saving programs share: the cluster's settings, Slurm host
lists, scontrol, and the EC2 instances that stand for Slurm nodes.

Every compute instance carries two tags: hpctrain:cluster (the stack's cluster name) and
hpctrain:node (the Slurm node name it stands for). The settings come from a JSON file that the
head node's bootstrap writes (HPCTRAIN_CLOUD_CONFIG, default /etc/hpctrain/cloud.json):

  {"cluster": "hpctrain", "region": "us-east-1", "launch_template_id": "lt-...",
   "fallback_launch_template_id": "lt-..." (on-demand, for spot's fallback), "subnet_ids": ["subnet-..."], "market": "spot" | "on-demand", "spot_fallback": true,
   "log_file": "/var/log/hpctrain/power.log"}
"""

import argparse
import json
import logging
import os
import re
import subprocess
import sys

CLUSTER_TAG = "hpctrain:cluster"
NODE_TAG = "hpctrain:node"
# Instance states in which an instance still stands for its node (or costs money).
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
}


class OneLineParser(argparse.ArgumentParser):
    """argparse with bad input reported as one line ("PROG: error: ...") and exit code 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


class ConfigError(Exception):
    """The settings file is missing or malformed."""


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
    subnets = cfg.setdefault("subnet_ids", [])
    if not isinstance(subnets, list) or not all(isinstance(s, str) and s for s in subnets):
        raise ConfigError(f"{path}: 'subnet_ids' must be a list of subnet ids")
    if cfg.setdefault("market", "on-demand") not in ("spot", "on-demand"):
        raise ConfigError(f"{path}: 'market' must be 'spot' or 'on-demand', not {cfg['market']!r}")
    cfg.setdefault("spot_fallback", True)
    return cfg


def expand_hostlist(text):
    """Slurm's compressed host list, as ResumeProgram gets it: 'gpu-[1-3,7],cpu-1' ->
    ['gpu-1', 'gpu-2', 'gpu-3', 'gpu-7', 'cpu-1']. Zero padding is kept (n[01-02])."""
    items, depth, start = [], 0, 0
    text = text or ""
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
                width = len(bounds[0])
                for i in range(int(bounds[0]), int(bounds[1]) + 1):
                    names.append(f"{prefix}{i:0{width}d}{suffix}")
            else:
                raise ValueError(f"not a Slurm host list: {text!r}")
    if not names:
        raise ValueError(f"no node names in {text!r}")
    return names


def scontrol(*args):
    """Runs scontrol (the one on PATH); an error is logged, not raised: one node's failure must
    not stop the others from being handled."""
    cmd = ["scontrol", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        logging.error("%s failed (%d): %s", " ".join(cmd), r.returncode, r.stderr.strip())
    return r.returncode == 0


def set_down(node, reason):
    """Takes a node down with a reason: Slurm requeues its job and, with ReturnToService=2,
    powers it up again only when asked to."""
    return scontrol("update", f"nodename={node}", "state=down", f"reason={reason[:200]}")


def ec2_client(cfg):
    import boto3  # imported here so that --help and the host list work without boto3

    return boto3.client("ec2", region_name=cfg["region"])


def instances_of(ec2, cfg, nodes=None):
    """{node name: [instance ids]} of the cluster's live instances (of `nodes` only, if given)."""
    filters = [
        {"Name": f"tag:{CLUSTER_TAG}", "Values": [cfg["cluster"]]},
        {"Name": "instance-state-name", "Values": LIVE_STATES},
    ]
    if nodes:
        filters.append({"Name": f"tag:{NODE_TAG}", "Values": list(nodes)})
    found = {}
    for page in ec2.get_paginator("describe_instances").paginate(Filters=filters):
        for reservation in page["Reservations"]:
            for inst in reservation["Instances"]:
                tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
                if NODE_TAG in tags:
                    found.setdefault(tags[NODE_TAG], []).append(inst["InstanceId"])
    return found


def setup_logging(cfg, program):
    handlers = [logging.StreamHandler(sys.stderr)]
    log_file = cfg.get("log_file") if cfg else None
    if log_file:
        try:
            os.makedirs(os.path.dirname(log_file), exist_ok=True)
            handlers.append(logging.FileHandler(log_file))
        except OSError:
            pass
    logging.basicConfig(level=logging.INFO, handlers=handlers, force=True,
                        format=f"%(asctime)s {program}: %(levelname)s: %(message)s")


def main_wrapper(program, body):
    """Runs body(cfg, nodes) for `program NODELIST`, turning bad input into one error line and
    exit code 2."""
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
    return body(cfg, nodes)

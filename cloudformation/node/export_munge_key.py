#!/usr/bin/env python3
"""Serves the cluster's munge key to the compute nodes from the head node, as ParallelCluster does
(its head node exports a root-only directory to the compute nodes): the compute role may not read
the key from Secrets Manager, so that no process that gets hold of a compute node's credentials
(a job, if the metadata firewall ever fails) can forge Slurm credentials for root.

The key (--key, default /etc/munge/munge.key) is copied into --dir (default /etc/hpctrain/keys,
root's, 0700), and --dir is exported over NFS read-only to the compute subnets only (their CIDRs
from EC2, the subnets named in cloud.json), with `secure`: only a client's root, from a privileged
port, can mount it (a job on a compute node cannot), and root there is root here
(no_root_squash) so that it can read the 0400 file. Run as root by bootstrap_head.sh and again by
apply_head_settings.sh (an update may change the subnets); `exportfs -ra` applies the exports.

    export_munge_key.py [--config cloud.json] [--key FILE] [--dir DIR] [--exports FILE]
"""

import ipaddress
import os
import shutil
import subprocess
import sys

from hpc_cloud import ConfigError, OneLineParser, ec2_client, load_config, write_atomically

EXPORT_OPTIONS = "ro,secure,no_root_squash,no_subtree_check,sec=sys"


def compute_cidrs(ec2, cfg):
    """The IPv4 ranges of the compute subnets named in cloud.json."""
    if not cfg["subnet_ids"]:
        raise ConfigError("cloud.json names no compute subnet: nothing to export the key to")
    reply = ec2.describe_subnets(SubnetIds=cfg["subnet_ids"])
    return sorted(str(ipaddress.ip_network(s["CidrBlock"])) for s in reply["Subnets"])


def exports_line(directory, cidrs):
    """/etc/exports' line for `directory`, to `cidrs` only (never a wildcard)."""
    if not cidrs:
        raise ValueError("no compute subnet to export the key to")
    return f"{directory} " + " ".join(f"{c}({EXPORT_OPTIONS})" for c in cidrs) + "\n"


def export(key, directory, exports, cidrs):
    os.makedirs(directory, mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    with open(key, "rb") as f:
        write_atomically(os.path.join(directory, "munge.key"), f.read(), 0o400)
    os.makedirs(os.path.dirname(exports), exist_ok=True)
    write_atomically(exports, exports_line(directory, cidrs), 0o644)
    exportfs = shutil.which("exportfs") or "/usr/sbin/exportfs"
    r = subprocess.run([exportfs, "-ra"], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise OSError(f"exportfs -ra failed ({r.returncode}): {r.stderr.strip()}")


def main():
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", help="cloud.json (default: HPCTRAIN_CLOUD_CONFIG or /etc/hpctrain/cloud.json)")
    p.add_argument("--key", default="/etc/munge/munge.key")
    p.add_argument("--dir", default="/etc/hpctrain/keys")
    p.add_argument("--exports", default="/etc/exports.d/hpctrain-keys.exports")
    a = p.parse_args()
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        cfg = load_config(a.config)
        export(a.key, a.dir, a.exports, compute_cidrs(ec2_client(cfg), cfg))
    except (ConfigError, BotoCoreError, ClientError, OSError, ValueError) as e:
        print(f"export_munge_key.py: error: {e}", file=sys.stderr)
        return 1
    print(f"export_munge_key.py: {a.dir} exported to the compute subnets ({a.exports})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

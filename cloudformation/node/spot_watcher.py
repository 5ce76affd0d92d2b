#!/usr/bin/env python3
"""Runs on every compute node (a systemd service): polls the instance metadata service (IMDSv2,
with a session token) every 5 seconds for a spot interruption notice (spot/instance-action)
and a rebalance recommendation. On an interruption notice it drains the node in Slurm (no new
jobs) and sends SIGUSR1 to the batch shell of every job on the node, which slurm/train.sbatch
passes on to hpctrain: it checkpoints and exits 75 inside the two-minute window, and the job is
requeued. A rebalance recommendation drains the node (or, with --on-rebalance checkpoint, is
treated as an interruption). Each notice is acted on once.

    spot_watcher.py [--node NAME] [--imds URL] [--interval SECONDS] [--on-rebalance drain|checkpoint]
"""

import json
import logging
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

from hpc_cloud import OWN_REASON_PREFIX, OneLineParser

TOKEN_TTL = 21600


class Imds:
    """IMDSv2: a token from PUT /latest/api/token, sent with every read."""

    def __init__(self, base):
        self.base = base.rstrip("/")
        self.token = None
        self.token_expires = 0.0

    def _token(self):
        if self.token is None or time.monotonic() > self.token_expires:
            req = urllib.request.Request(f"{self.base}/latest/api/token", method="PUT",
                                         headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL)})
            with urllib.request.urlopen(req, timeout=2) as r:
                self.token = r.read().decode()
            self.token_expires = time.monotonic() + TOKEN_TTL - 60
        return self.token

    def get(self, path):
        """The document at `path`, or None when there is none (404)."""
        for attempt in (1, 2):
            req = urllib.request.Request(f"{self.base}/latest/meta-data/{path}",
                                         headers={"X-aws-ec2-metadata-token": self._token()})
            try:
                with urllib.request.urlopen(req, timeout=2) as r:
                    return r.read().decode()
            except urllib.error.HTTPError as e:
                if e.code == 404:
                    return None
                if e.code == 401 and attempt == 1:  # the token expired early: take a new one
                    self.token = None
                    continue
                raise
        return None


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        logging.error("%s failed (%d): %s", " ".join(cmd), r.returncode, r.stderr.strip())
    return r


def drain(node, reason):
    """Drains with a reason marked as the cluster's own: once the node's jobs have left, the
    cluster manager powers it down (its instance is terminated) and returns it to service."""
    run(["scontrol", "update", f"nodename={node}", "state=drain", f"reason={OWN_REASON_PREFIX}{reason}"[:200]])


def checkpoint_jobs(node):
    """SIGUSR1 to the batch shell of each job running on the node (train.sbatch forwards it)."""
    out = run(["squeue", "-h", "-w", node, "-t", "RUNNING", "-o", "%A"]).stdout.split()
    jobs = sorted(set(out), key=lambda j: (len(j), j))
    for job in jobs:
        run(["scancel", "--signal=USR1", "--batch", job])
    return jobs


def node_name(given):
    if given:
        return given
    try:
        with open("/etc/hpctrain/node-name", encoding="utf-8") as f:
            name = f.read().strip()
            if name:
                return name
    except OSError:
        pass
    return socket.gethostname().split(".")[0]


def watch(args):
    imds = Imds(args.imds)
    node = node_name(args.node)
    acted = set()
    logging.info("watching %s for spot interruptions on node %s every %g s", args.imds, node, args.interval)
    while True:
        try:
            action = imds.get("spot/instance-action")
            rebalance = imds.get("events/recommendations/rebalance")
        except (urllib.error.URLError, OSError, ValueError) as e:
            logging.warning("metadata service: %s", e)
            action = rebalance = None
        if action and "interruption" not in acted:
            acted.add("interruption")
            try:
                notice = json.loads(action)
                what = f"spot interruption: {notice.get('action', '?')} at {notice.get('time', '?')}"
            except json.JSONDecodeError:
                what = "spot interruption"
            drain(node, what)
            jobs = checkpoint_jobs(node)
            logging.warning("%s: drained %s, asked job(s) %s to checkpoint", what, node, ", ".join(jobs) or "(none)")
        if rebalance and "rebalance" not in acted and "interruption" not in acted:
            acted.add("rebalance")
            drain(node, "spot rebalance recommendation")
            jobs = checkpoint_jobs(node) if args.on_rebalance == "checkpoint" else []
            logging.warning("spot rebalance recommendation: drained %s%s", node,
                            f", asked job(s) {', '.join(jobs)} to checkpoint" if jobs else "")
        if args.once:
            return 0
        time.sleep(args.interval)


def node_daemon_parser(doc, interval, every, imds_use=""):
    """The options of the compute nodes' daemons (this one and computemgtd.py): --node, --imds
    (the metadata service, IMDS_USE saying what for), --interval (seconds between EVERY, default
    INTERVAL) and --once."""
    p = OneLineParser(description=doc.split("\n\n")[0])
    p.add_argument("--node", help="this node's Slurm name (default: /etc/hpctrain/node-name, else the host name)")
    p.add_argument("--imds", default=os.environ.get("HPCTRAIN_IMDS", "http://169.254.169.254"),
                   help=f"the instance metadata service{imds_use} (default %(default)s)")
    p.add_argument("--interval", type=float, default=interval, help=f"seconds between {every} (default {interval:g})")
    p.add_argument("--once", action="store_true", help="look once and exit")
    return p


def run_node_daemon(program, watch, args):
    """watch(args), logging as PROGRAM; an interrupt ends it quietly (exit 0)."""
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {program}: %(levelname)s: %(message)s")
    try:
        return watch(args)
    except KeyboardInterrupt:
        return 0


def main():
    p = node_daemon_parser(__doc__, 5.0, "polls")
    p.add_argument("--on-rebalance", choices=["drain", "checkpoint"], default="drain")
    args = p.parse_args()
    if not args.interval > 0:
        p.error("--interval must be positive")
    return run_node_daemon("spot_watcher", watch, args)


if __name__ == "__main__":
    sys.exit(main())

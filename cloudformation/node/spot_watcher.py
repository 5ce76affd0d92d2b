#!/usr/bin/env python3
"""Runs on every compute node (a systemd service): polls the instance metadata service (IMDSv2,
with a session token) every 5 seconds for a spot interruption notice (spot/instance-action)
and a rebalance recommendation. On an interruption notice it drains the node in Slurm (no new
jobs) and sends SIGUSR1 to the batch shell of every job on the node, which slurm/train.sbatch
passes on to hpctrain: it checkpoints and exits 75 inside the two-minute window, and the job is
requeued. A rebalance recommendation drains the node (or, with --on-rebalance checkpoint, is
treated as an interruption). A notice is acted on until that has worked: the drain is tried at
each poll until it succeeds, and while the notice stands the node's running jobs are listed at
each poll and each job not yet signalled is signalled (a slurmctld too busy to answer once must
not cost a job its checkpoint).

    spot_watcher.py [--node NAME] [--imds URL] [--interval SECONDS] [--on-rebalance drain|checkpoint]
"""

import http.client
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


# Seconds a Slurm command may take: the two-minute notice leaves no time to wait on a hung one,
# and the next poll tries again.
COMMAND_TIMEOUT = 20


def run(cmd):
    """cmd's result; a failure (an exit status, a command that hangs or is missing) is logged and
    has a non-zero returncode."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        r = subprocess.CompletedProcess(cmd, -1, "", str(e))
    if r.returncode != 0:
        logging.error("%s failed (%d): %s", " ".join(cmd), r.returncode, r.stderr.strip())
    return r


def drain(node, reason):
    """Drains with a reason marked as the cluster's own: once the node's jobs have left, the
    cluster manager powers it down (its instance is terminated) and returns it to service.
    Whether scontrol succeeded."""
    return run(["scontrol", "update", f"nodename={node}", "state=drain",
                f"reason={OWN_REASON_PREFIX}{reason}"[:200]]).returncode == 0


def checkpoint_jobs(node, signalled):
    """SIGUSR1 to the batch shell of each job running on the node (train.sbatch forwards it) that
    is not in `signalled`, each added to it once scancel succeeded. Returns the jobs signalled
    now, or None when squeue failed: a failed listing is not "no jobs", and the next poll lists
    them again."""
    r = run(["squeue", "-h", "-w", node, "-t", "RUNNING", "-o", "%A"])
    if r.returncode != 0:
        return None
    done = []
    for job in sorted(set(r.stdout.split()) - signalled, key=lambda j: (len(j), j)):
        if run(["scancel", "--signal=USR1", "--batch", job]).returncode == 0:
            signalled.add(job)
            done.append(job)
    return done


def respond(node, kind, what, checkpoint, drained, signalled):
    """One poll's work while a notice of `kind` stands: drains the node for `what` unless that
    worked before (`drained`: the kinds it worked for), and with `checkpoint` signals the node's
    jobs not yet in `signalled`. Called at every poll while the notice stands, so that what
    failed is done at a later poll, and a job listed late is signalled too."""
    said = []
    if kind not in drained and drain(node, what):
        drained.add(kind)
        said.append(f"drained {node}")
    if checkpoint:
        jobs = checkpoint_jobs(node, signalled)
        if jobs is None:
            logging.warning("%s: the jobs on %s not listed; again at the next poll", what, node)
        elif jobs or said:
            said.append(f"asked job(s) {', '.join(jobs) or '(none)'} to checkpoint")
    if said:
        logging.warning("%s: %s", what, ", ".join(said))


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
    drained, signalled = set(), set()
    seen = set()  # the kinds of notice seen: after an interruption, a rebalance recommendation is moot
    logging.info("watching %s for spot interruptions on node %s every %g s", args.imds, node, args.interval)
    while True:
        try:
            action = imds.get("spot/instance-action")
            rebalance = imds.get("events/recommendations/rebalance")
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as e:
            # (HTTPException: a reply cut short, IncompleteRead, or garbled): the next poll asks again
            logging.warning("metadata service: %s: %s", type(e).__name__, e)
            action = rebalance = None
        if action:
            seen.add("interruption")
            try:
                notice = json.loads(action)
                what = f"spot interruption: {notice.get('action', '?')} at {notice.get('time', '?')}"
            except (json.JSONDecodeError, AttributeError):
                what = "spot interruption"
            respond(node, "interruption", what, True, drained, signalled)
        elif rebalance and "interruption" not in seen:
            seen.add("rebalance")
            respond(node, "rebalance", "spot rebalance recommendation", args.on_rebalance == "checkpoint",
                    drained, signalled)
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

#!/usr/bin/env python3
"""The compute node's watchdog (as ParallelCluster's computemgtd), a systemd service on every
compute node: when the head node is gone, nothing would ever terminate this instance, so it
terminates itself: `shutdown -h now`, which the launch templates (InstanceInitiatedShutdownBehavior:
terminate) turn into termination. That needs no permission: IAM cannot grant an instance the right
to terminate itself without also granting it others.

The head node counts as gone when both hold: its cluster manager has not written the heartbeat
file for --stale-after seconds, and Slurm has this node DOWN or cannot be asked about it at all
(slurmctld unreachable, or an scontrol that fails or hangs; each try is bounded). A stale
heartbeat while slurmctld still has the node up (idle, allocated...) is only a warning: the
head lives, its cluster manager has stopped. A failed heartbeat read (missing file, a glitch or
hang on /shared) keeps the last heartbeat read; a node that has never read one counts from the
watchdog's start.

    computemgtd.py [--heartbeat FILE] [--stale-after SECONDS] [--node NAME] [--interval SECONDS]
                   [--imds URL] [--once]
"""

import logging
import re
import subprocess
import sys
import threading
import time

from spot_watcher import Imds, node_daemon_parser, node_name, run_node_daemon

DEFAULT_HEARTBEAT = "/shared/.hpctrain/clustermgtd.heartbeat"
SLURM_TRIES, SLURM_TIMEOUT, SLURM_PAUSE = 3, 10.0, 2.0  # scontrol: tries, seconds each, seconds between


def read_heartbeat(path, timeout=30.0):
    """The time the head node last wrote the heartbeat, or None (missing, unreadable, or a read
    that did not finish within `timeout` s: a hung NFS read must not hang the watchdog)."""
    result = []

    def read():
        try:
            with open(path, encoding="utf-8") as f:
                result.append(float(f.read().strip()))
        except (OSError, ValueError):
            pass
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout)
    return result[0] if result else None


def terminate_self(imds_url):
    """Shuts this instance down (and so terminates it); returns its id, for the log."""
    try:
        instance = Imds(imds_url).get("instance-id") or "this instance"
    except Exception as e:  # noqa: BLE001 - the id is only for the log: the shutdown matters
        instance = f"this instance (no id from the metadata service: {e})"
    logging.warning("shutting down %s", instance)
    subprocess.run(["shutdown", "-h", "now"], check=False)
    return instance


def slurm_state(node):
    """This node's state and flags in Slurm (e.g. "ALLOCATED+CLOUD"), or None when slurmctld
    cannot be asked: every try failed or ran past SLURM_TIMEOUT (a hung scontrol is killed)."""
    error = "?"
    for attempt in range(SLURM_TRIES):
        time.sleep(SLURM_PAUSE if attempt else 0)
        try:
            r = subprocess.run(["scontrol", "--oneliner", "show", "node", node], capture_output=True, text=True,
                               timeout=SLURM_TIMEOUT, check=False)
        except (OSError, subprocess.SubprocessError) as e:
            error = str(e)
            continue
        state = re.search(r"\bState=(\S+)", r.stdout)
        if r.returncode == 0 and state:
            return state.group(1)
        error = r.stderr.strip() or f"exit status {r.returncode}"
    logging.warning("slurmctld cannot be asked about node %s: %s", node, error)
    return None


def head_gone(node, silent, last_beat):
    """Asked once the heartbeat is stale: is the head node gone, not just its cluster manager?"""
    state = slurm_state(node)
    since = f"for {silent:.0f} s (last: {time.ctime(last_beat) if last_beat is not None else 'never'})"
    if state is not None and "DOWN" not in {f.rstrip("*").upper() for f in state.split("+")}:
        logging.warning("no heartbeat from the head node's cluster manager %s, but slurmctld has node %s %s: the "
                        "head lives, its cluster manager has stopped; not shutting down", since, node, state.lower())
        return False
    logging.warning("no heartbeat from the head node %s and %s: terminating this instance", since,
                    "slurmctld cannot be reached" if state is None else f"Slurm has node {node} down")
    return True


class Watchdog:
    """This node's watch: check() once per --interval."""

    def __init__(self, args):
        self.args = args
        self.node = node_name(args.node)
        self.started = time.time()
        self.last_beat = None  # a failed read keeps it: a glitch on /shared is not the head's silence

    def check(self):
        """One look; True when this instance has been shut down."""
        beat = read_heartbeat(self.args.heartbeat)
        if beat is not None:
            self.last_beat = beat
        silent = time.time() - (self.last_beat if self.last_beat is not None else self.started)
        if silent <= self.args.stale_after or not head_gone(self.node, silent, self.last_beat):
            return False
        terminate_self(self.args.imds)
        return True


def watch(args):
    dog = Watchdog(args)
    logging.info("watching %s: node %s terminates itself %g s after the last heartbeat if Slurm has it down "
                 "or cannot be reached", args.heartbeat, dog.node, args.stale_after)
    while not dog.check() and not args.once:
        time.sleep(args.interval)
    return 0


def main():
    p = node_daemon_parser(__doc__, 30.0, "checks", ", for this instance's id")
    p.add_argument("--heartbeat", default=DEFAULT_HEARTBEAT,
                   help="the cluster manager's heartbeat file (default %(default)s)")
    p.add_argument("--stale-after", type=float, default=900.0,
                   help="seconds without a heartbeat before the head counts as gone, if Slurm agrees (default 900)")
    args = p.parse_args()
    if not args.stale_after > 0 or not args.interval > 0:
        p.error("--stale-after and --interval must be positive")
    return run_node_daemon("computemgtd", watch, args)


if __name__ == "__main__":
    sys.exit(main())

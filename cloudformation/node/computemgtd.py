#!/usr/bin/env python3
"""The compute node's watchdog (as ParallelCluster's computemgtd), a systemd service on every
compute node: when the head node's cluster manager has not written its heartbeat file for
--stale-after seconds (the head node is gone, or its manager has stopped), nothing would ever
terminate this instance, so it terminates itself: `shutdown -h now`, which the launch templates
(InstanceInitiatedShutdownBehavior: terminate) turn into termination. That needs no permission:
IAM cannot grant an instance the right to terminate itself without also granting it others.
A node that finds no heartbeat (it booted before the first one, or /shared hangs) counts from
the watchdog's start instead.

    computemgtd.py [--heartbeat FILE] [--stale-after SECONDS] [--interval SECONDS] [--imds URL] [--once]
"""

import logging
import os
import subprocess
import sys
import threading
import time

from hpc_cloud import OneLineParser
from spot_watcher import Imds

DEFAULT_HEARTBEAT = "/shared/.hpctrain/clustermgtd.heartbeat"


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


def watch(args):
    started = time.time()
    logging.info("watching %s: this instance terminates itself %g s after the last heartbeat",
                 args.heartbeat, args.stale_after)
    while True:
        beat = read_heartbeat(args.heartbeat)
        silent = time.time() - (beat if beat is not None else started)
        if silent > args.stale_after:
            logging.warning("no heartbeat from the head node for %.0f s (last: %s): terminating this instance",
                            silent, time.ctime(beat) if beat else "never")
            terminate_self(args.imds)
            return 0
        if args.once:
            return 0
        time.sleep(args.interval)


def main():
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--heartbeat", default=DEFAULT_HEARTBEAT, help="the cluster manager's heartbeat file (default %(default)s)")
    p.add_argument("--stale-after", type=float, default=900.0,
                   help="seconds without a heartbeat before the instance terminates itself (default 900)")
    p.add_argument("--interval", type=float, default=30.0, help="seconds between checks (default 30)")
    p.add_argument("--imds", default=os.environ.get("HPCTRAIN_IMDS", "http://169.254.169.254"),
                   help="the instance metadata service, for this instance's id (default %(default)s)")
    p.add_argument("--once", action="store_true", help="check once and exit")
    args = p.parse_args()
    if not args.stale_after > 0 or not args.interval > 0:
        p.error("--stale-after and --interval must be positive")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s computemgtd: %(levelname)s: %(message)s")
    try:
        return watch(args)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())

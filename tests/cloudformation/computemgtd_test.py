"""The compute node's watchdog (cloudformation/node/computemgtd.py), with a fake instance metadata
service (IMDSv2, the one spot_watcher_test.py serves on loopback), a fake `shutdown` on PATH that
records its calls, and a fake `scontrol` on PATH that shows the node in the state a test sets (or
fails as with slurmctld unreachable, or hangs). With a fresh heartbeat from the head node nothing
happens; with a stale one (or none since the watchdog started) the instance shuts itself down
only when Slurm has the node down or cannot be reached, which its launch template turns into
termination (template_test.py checks InstanceInitiatedShutdownBehavior in the stack deployed
into moto). A failed heartbeat read keeps the last good one."""

import argparse
import os
import re
import sys
import tempfile
import threading
import time
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "cloudformation", "node"))
sys.path.insert(0, HERE)

import computemgtd  # noqa: E402
from spot_watcher_test import FakeImds  # noqa: E402

HOURS_UP = 2 * 3600  # the node had run 2 hours when one failed read shut it down


class Watchdog(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.imds = FakeImds()
        self.imds.documents["instance-id"] = "i-0123456789abcdef0"
        threading.Thread(target=self.imds.serve_forever, daemon=True).start()
        self.addCleanup(self.imds.server_close)
        self.addCleanup(self.imds.shutdown)
        self.heartbeat = os.path.join(self.tmp.name, "clustermgtd.heartbeat")
        self.shutdowns = os.path.join(self.tmp.name, "shutdown.calls")
        self.scontrol_calls = os.path.join(self.tmp.name, "scontrol.calls")
        self.node_state = os.path.join(self.tmp.name, "node.state")  # absent: slurmctld cannot be reached
        bindir = os.path.join(self.tmp.name, "bin")
        os.mkdir(bindir)
        for name, body in (
                ("shutdown", f'echo "$*" >> {self.shutdowns}'),
                ("scontrol", f'echo "$*" >> {self.scontrol_calls}\n'
                             f'[ "$(cat {self.node_state} 2>/dev/null)" = hang ] && exec sleep 30\n'
                             f'[ -f {self.node_state} ] || {{ echo "slurm_load_node error: Unable to contact slurm '
                             f'controller (connect failure)" >&2; exit 1; }}\n'
                             f'echo "NodeName=$4 Arch=x86_64 CoresPerSocket=1 State=$(cat {self.node_state}) '
                             f'ThreadsPerCore=1"')):
            with open(os.path.join(bindir, name), "w", encoding="utf-8") as f:
                f.write(f"#!/bin/sh\n{body}\n")
            os.chmod(os.path.join(bindir, name), 0o755)
        self.enterContext(mock.patch.dict(os.environ, {"PATH": bindir + os.pathsep + os.environ["PATH"]}))
        self.enterContext(mock.patch.object(computemgtd, "SLURM_PAUSE", 0.0))

    def beat(self, age):
        with open(self.heartbeat, "w", encoding="utf-8") as f:
            f.write(f"{time.time() - age:.0f}\n")

    def slurm(self, state):
        with open(self.node_state, "w", encoding="utf-8") as f:
            f.write(state)

    def args(self, stale_after, once=True):
        return argparse.Namespace(heartbeat=self.heartbeat, stale_after=stale_after, interval=0.1, once=once,
                                  node="gpu-7", imds=f"http://127.0.0.1:{self.imds.server_address[1]}")

    def watch(self, stale_after, once=True):
        with self.assertLogs(level="INFO") as logs:
            self.assertEqual(computemgtd.watch(self.args(stale_after, once)), 0)
        return "\n".join(logs.output)

    def watchdog(self, stale_after, up_for):
        """A watchdog started `up_for` seconds ago."""
        dog = computemgtd.Watchdog(self.args(stale_after))
        dog.started -= up_for
        return dog

    def check(self, dog):
        """One look; what it logged (at least one line: the assertion needs one)."""
        with self.assertLogs(level="INFO") as logs:
            dog.check()
            computemgtd.logging.info("checked")
        return "\n".join(logs.output)

    def shut_down(self):
        if not os.path.exists(self.shutdowns):
            return []
        with open(self.shutdowns, encoding="utf-8") as f:
            return f.read().splitlines()

    def asked_slurm(self):
        if not os.path.exists(self.scontrol_calls):
            return []
        with open(self.scontrol_calls, encoding="utf-8") as f:
            return f.read().splitlines()

    def test_a_fresh_heartbeat_keeps_the_instance(self):
        self.beat(age=5)
        self.watch(stale_after=60)
        self.assertEqual(self.shut_down(), [])
        self.assertEqual(self.asked_slurm(), [], "Slurm asked while the heartbeat is fresh")

    def test_a_failed_read_keeps_the_last_heartbeat(self):
        # The case: a node up for 2 hours reads a good heartbeat, then one read fails.
        for slurm in ("allocated+cloud", None):  # the node busy; slurmctld unreachable too (the head gone)
            with self.subTest(slurm=slurm):
                if slurm:
                    self.slurm(slurm)
                elif os.path.exists(self.node_state):
                    os.unlink(self.node_state)
                dog = self.watchdog(stale_after=10, up_for=HOURS_UP)
                self.beat(age=0)
                self.check(dog)
                for glitch in ("missing", "not a number"):  # a read that fails, then one that reads garbage
                    if glitch == "missing":
                        os.unlink(self.heartbeat)
                    else:
                        with open(self.heartbeat, "w", encoding="utf-8") as f:
                            f.write("12:0")
                    self.check(dog)
                self.assertEqual(self.shut_down(), [])

    def test_a_stale_heartbeat_with_the_node_up_in_slurm_is_a_warning(self):
        self.beat(age=120)
        for state in ("allocated+cloud", "idle+cloud", "mixed+drain+cloud"):
            with self.subTest(state=state):
                self.slurm(state)
                log = self.watch(stale_after=60)
                self.assertEqual(self.shut_down(), [])
                self.assertRegex(log, f"WARNING:.*no heartbeat .* for 12[0-9] s .*slurmctld has node gpu-7 "
                                      f"{re.escape(state)}: the head lives, its cluster manager has stopped")
        self.assertEqual(self.asked_slurm()[0], "--oneliner show node gpu-7")

    def test_a_stale_heartbeat_with_the_node_down_shuts_the_instance_down(self):
        self.beat(age=120)
        self.slurm("DOWN*+CLOUD+NOT_RESPONDING")
        log = self.watch(stale_after=60)
        self.assertEqual(self.shut_down(), ["-h now"])
        self.assertIn("Slurm has node gpu-7 down", log)
        self.assertIn("shutting down i-0123456789abcdef0", log)
        self.assertEqual(self.imds.tokenless_reads, 0, "a metadata read without the IMDSv2 token")

    def test_a_stale_heartbeat_with_slurmctld_unreachable_shuts_the_instance_down(self):
        self.beat(age=120)
        log = self.watch(stale_after=60)
        self.assertEqual(self.shut_down(), ["-h now"])
        self.assertIn("slurmctld cannot be asked about node gpu-7: slurm_load_node error: Unable to contact", log)
        self.assertEqual(len(self.asked_slurm()), computemgtd.SLURM_TRIES)

    def test_a_hung_scontrol_counts_as_unreachable(self):
        self.beat(age=120)
        self.slurm("hang")
        started = time.monotonic()
        with mock.patch.object(computemgtd, "SLURM_TIMEOUT", 0.3):
            self.watch(stale_after=60)
        self.assertLess(time.monotonic() - started, 10)
        self.assertEqual(self.shut_down(), ["-h now"])

    def test_no_heartbeat_since_the_watchdog_started(self):
        started, sleep = time.monotonic(), time.sleep

        def bounded_sleep(seconds):  # a watchdog that never shuts down fails here instead of hanging
            self.assertLess(time.monotonic() - started, 10, "no shutdown 10 s after the start")
            sleep(seconds)
        with mock.patch.object(computemgtd.time, "sleep", bounded_sleep):
            self.watch(stale_after=0.5, once=False)
        self.assertGreaterEqual(time.monotonic() - started, 0.5)  # the grace of a node that booted first
        self.assertEqual(self.shut_down(), ["-h now"])

    def test_never_a_heartbeat_and_started_long_ago(self):
        self.slurm("down+cloud")
        log = self.check(self.watchdog(stale_after=60, up_for=HOURS_UP))
        self.assertEqual(self.shut_down(), ["-h now"])
        self.assertIn("(last: never)", log)

    def test_without_the_metadata_service_it_still_shuts_down(self):
        self.beat(age=120)
        self.imds.shutdown()
        self.imds.server_close()
        self.watch(stale_after=60)
        self.assertEqual(self.shut_down(), ["-h now"])


if __name__ == "__main__":
    unittest.main()

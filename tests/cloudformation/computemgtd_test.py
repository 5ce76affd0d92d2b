"""The compute node's watchdog (cloudformation/node/computemgtd.py), with a fake instance metadata
service (IMDSv2, the one spot_watcher_test.py serves on loopback) and a fake `shutdown` on PATH
that records its calls: with a fresh heartbeat from the head node nothing happens; with a stale
one, or none since the watchdog started, the instance shuts itself down, which its launch
template turns into termination (template_test.py checks InstanceInitiatedShutdownBehavior in
the stack deployed into moto)."""

import argparse
import os
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
        bindir = os.path.join(self.tmp.name, "bin")
        os.mkdir(bindir)
        with open(os.path.join(bindir, "shutdown"), "w", encoding="utf-8") as f:
            f.write(f'#!/bin/sh\necho "$*" >> {self.shutdowns}\n')
        os.chmod(os.path.join(bindir, "shutdown"), 0o755)
        self.enterContext(mock.patch.dict(os.environ, {"PATH": bindir + os.pathsep + os.environ["PATH"]}))

    def beat(self, age):
        with open(self.heartbeat, "w", encoding="utf-8") as f:
            f.write(f"{time.time() - age:.0f}\n")

    def watch(self, stale_after, once=True):
        args = argparse.Namespace(heartbeat=self.heartbeat, stale_after=stale_after, interval=0.1, once=once,
                                  imds=f"http://127.0.0.1:{self.imds.server_address[1]}")
        with self.assertLogs(level="INFO") as logs:
            self.assertEqual(computemgtd.watch(args), 0)
        return "\n".join(logs.output)

    def shut_down(self):
        if not os.path.exists(self.shutdowns):
            return []
        with open(self.shutdowns, encoding="utf-8") as f:
            return f.read().splitlines()

    def test_a_fresh_heartbeat_keeps_the_instance(self):
        self.beat(age=5)
        self.watch(stale_after=60)
        self.assertEqual(self.shut_down(), [])

    def test_a_stale_heartbeat_shuts_the_instance_down(self):
        self.beat(age=120)
        log = self.watch(stale_after=60)
        self.assertEqual(self.shut_down(), ["-h now"])
        self.assertIn("shutting down i-0123456789abcdef0", log)
        self.assertEqual(self.imds.tokenless_reads, 0, "a metadata read without the IMDSv2 token")

    def test_no_heartbeat_since_the_watchdog_started(self):
        started = time.monotonic()
        self.watch(stale_after=0.5, once=False)
        self.assertGreaterEqual(time.monotonic() - started, 0.5)  # the grace of a node that booted first
        self.assertEqual(self.shut_down(), ["-h now"])

    def test_without_the_metadata_service_it_still_shuts_down(self):
        self.beat(age=120)
        self.imds.shutdown()
        self.imds.server_close()
        self.watch(stale_after=60)
        self.assertEqual(self.shut_down(), ["-h now"])


if __name__ == "__main__":
    unittest.main()

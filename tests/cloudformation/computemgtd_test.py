"""The compute node's watchdog (cloudformation/node/computemgtd.py) against moto's EC2 and a fake
instance metadata service (IMDSv2, the one spot_watcher_test.py serves on loopback): with a
fresh heartbeat from the head node nothing happens; with a stale one, or none since the
watchdog started, the instance terminates itself (and only itself); when EC2 cannot be asked,
it shuts down instead (a fake `shutdown` on PATH records it)."""

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

try:
    import boto3
    from moto import mock_aws
except ImportError as e:  # pragma: no cover - CTest reports the skip
    print(f"SKIPPED: {e} (boto3 and moto are needed)")
    sys.exit(77)

import computemgtd  # noqa: E402
from spot_watcher_test import FakeImds  # noqa: E402

REGION = "us-east-1"


class Watchdog(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.enterContext(mock.patch.dict(os.environ, {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}))
        self.enterContext(mock_aws())
        self.ec2 = boto3.client("ec2", region_name=REGION)
        ami = self.ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        ids = [i["InstanceId"] for i in self.ec2.run_instances(ImageId=ami, MinCount=2, MaxCount=2)["Instances"]]
        self.me, self.other = ids
        self.imds = FakeImds()
        self.imds.documents.update({"instance-id": self.me, "placement/region": REGION})
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

    def watch(self, stale_after, once=True, imds=None):
        args = argparse.Namespace(heartbeat=self.heartbeat, stale_after=stale_after, interval=0.1, once=once,
                                  imds=imds or f"http://127.0.0.1:{self.imds.server_address[1]}")
        return computemgtd.watch(args)

    def state(self, instance):
        return self.ec2.describe_instances(InstanceIds=[instance])["Reservations"][0]["Instances"][0]["State"]["Name"]

    def test_a_fresh_heartbeat_keeps_the_instance(self):
        self.beat(age=5)
        self.assertEqual(self.watch(stale_after=60), 0)
        self.assertEqual((self.state(self.me), self.state(self.other)), ("running", "running"))

    def test_a_stale_heartbeat_terminates_this_instance_only(self):
        self.beat(age=120)
        self.assertEqual(self.watch(stale_after=60), 0)
        self.assertEqual((self.state(self.me), self.state(self.other)), ("terminated", "running"))
        self.assertEqual(self.imds.tokenless_reads, 0, "a metadata read without the IMDSv2 token")
        self.assertFalse(os.path.exists(self.shutdowns))

    def test_no_heartbeat_since_the_watchdog_started(self):
        started = time.monotonic()
        self.assertEqual(self.watch(stale_after=0.5, once=False), 0)
        self.assertGreaterEqual(time.monotonic() - started, 0.5)  # the grace of a node that booted first
        self.assertEqual(self.state(self.me), "terminated")

    def test_without_ec2_it_shuts_down(self):
        self.beat(age=120)
        self.assertEqual(self.watch(stale_after=60, imds="http://127.0.0.1:9"), 0)  # nothing listens there
        self.assertEqual(self.state(self.me), "running")
        with open(self.shutdowns, encoding="utf-8") as f:
            self.assertEqual(f.read(), "-h now\n")


if __name__ == "__main__":
    unittest.main()

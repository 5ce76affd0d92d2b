"""The cluster manager (cloudformation/node/clustermgtd.py) against moto's EC2, with fakes of
sinfo (printing the node states a test sets) and scontrol (recording its calls) on PATH: orphans
are terminated and nothing else (not another cluster's instance, not the head node, not an
instance within its grace period); nodes this cluster left down or drained are powered down and
returned to service, not those an administrator drained and not those still running jobs; a node
down for lack of capacity waits for a cooldown to end; a second pass changes nothing; the
heartbeat is written. The real slurmctld's side is tests/slurm/power_saving.sh."""

import json
import os
import subprocess
import sys
import tempfile
import time
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
NODE_DIR = os.path.join(HERE, "..", "..", "cloudformation", "node")
sys.path.insert(0, NODE_DIR)

try:
    import boto3
    from moto import mock_aws
except ImportError as e:  # pragma: no cover - CTest reports the skip
    print(f"SKIPPED: {e} (boto3 and moto are needed)")
    sys.exit(77)

import clustermgtd  # noqa: E402
import hpc_cloud  # noqa: E402

REGION = "us-east-1"


class ClusterManager(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.enterContext(mock.patch.dict(os.environ, {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                                                       "AWS_DEFAULT_REGION": REGION}))
        self.enterContext(mock_aws())
        self.calls = os.path.join(self.tmp.name, "scontrol.calls")
        self.sinfo_out = os.path.join(self.tmp.name, "sinfo.out")
        bindir = os.path.join(self.tmp.name, "bin")
        os.mkdir(bindir)
        for name, body in (("scontrol", f'echo "$*" >> {self.calls}'), ("sinfo", f"cat {self.sinfo_out}")):
            with open(os.path.join(bindir, name), "w", encoding="utf-8") as f:
                f.write(f"#!/bin/sh\n{body}\n")
            os.chmod(os.path.join(bindir, name), 0o755)
        self.enterContext(mock.patch.dict(os.environ, {"PATH": bindir + os.pathsep + os.environ["PATH"]}))
        self.ec2 = boto3.client("ec2", region_name=REGION)
        self.ami = self.ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        self.config = os.path.join(self.tmp.name, "cloud.json")
        with open(self.config, "w", encoding="utf-8") as f:
            json.dump({"cluster": "testc", "region": REGION, "launch_template_id": "lt-0", "orphan_grace_seconds": 0,
                       "instance_types": ["p5.48xlarge", "g5.12xlarge"], "controller": "head",
                       "state_file": os.path.join(self.tmp.name, "state.json"),
                       "heartbeat_file": os.path.join(self.tmp.name, "shared", "clustermgtd.heartbeat")}, f)
        self.enterContext(mock.patch.dict(os.environ, {"HPCTRAIN_CLOUD_CONFIG": self.config}))
        self.cfg = hpc_cloud.load_config()

    def launch(self, node, cluster="testc"):
        tags = [{"Key": "hpctrain:cluster", "Value": cluster}] + ([{"Key": "hpctrain:node", "Value": node}] if node else [])
        inst = self.ec2.run_instances(ImageId=self.ami, MinCount=1, MaxCount=1, InstanceType="g5.12xlarge",
                                      TagSpecifications=[{"ResourceType": "instance", "Tags": tags}])["Instances"][0]
        return inst["InstanceId"], inst["PrivateIpAddress"]

    def slurm(self, *nodes):
        """Sets what sinfo shows: (name, state, reason, address[, partitions]) per node (partition
        "gpu" unless given: a line for each, as sinfo --Node prints them)."""
        with open(self.sinfo_out, "w", encoding="utf-8") as f:
            for name, state, reason, addr, *partitions in nodes:
                for partition in (partitions or ["gpu"]):
                    f.write(f"{name:10}|{state:30}|{reason or 'none':60}|{addr or name:20}|{partition:10}|\n")

    def run_pass(self):
        with mock.patch.object(sys, "argv", ["clustermgtd.py"]):
            self.assertEqual(clustermgtd.main(), 0)
        calls = self.scontrol_calls()
        if os.path.exists(self.calls):
            os.unlink(self.calls)
        return calls

    def scontrol_calls(self):
        if not os.path.exists(self.calls):
            return []
        with open(self.calls, encoding="utf-8") as f:
            return f.read().splitlines()

    def live(self):
        out = set()
        for r in self.ec2.describe_instances(Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}])["Reservations"]:
            out |= {i["InstanceId"] for i in r["Instances"]}
        return out

    def test_orphans_are_terminated_and_nothing_else(self):
        busy, busy_ip = self.launch("gpu-1")
        second, _ = self.launch("gpu-1")            # a second instance for a node that has one
        powered_down, _ = self.launch("gpu-2")      # a suspend that failed
        unknown, _ = self.launch("gpu-9")           # a node Slurm does not have
        other, _ = self.launch("gpu-2", cluster="otherc")  # another cluster's
        head, _ = self.launch(None)                 # the head node: the cluster tag, no node tag
        self.slurm(("gpu-1", "allocated+cloud", "", busy_ip), ("gpu-2", "idle+cloud+powered_down", "", ""))
        self.assertEqual(self.run_pass(), [])
        self.assertEqual(self.live(), {busy, other, head})
        # The second pass finds nothing to do.
        self.assertEqual(self.run_pass(), [])
        self.assertEqual(self.live(), {busy, other, head})
        with open(self.cfg["heartbeat_file"], encoding="utf-8") as f:
            self.assertAlmostEqual(float(f.read()), time.time(), delta=30)
        del second, powered_down, unknown

    def test_a_young_instance_is_not_an_orphan_yet(self):
        with open(self.config, encoding="utf-8") as f:
            cfg = json.load(f)
        cfg["orphan_grace_seconds"] = 300
        with open(self.config, "w", encoding="utf-8") as f:
            json.dump(cfg, f)
        young, _ = self.launch("gpu-2")
        self.slurm(("gpu-2", "idle+cloud+powered_down", "", ""))
        self.run_pass()
        self.assertEqual(self.live(), {young})

    def test_nodes_the_cluster_left_down_or_drained_return_to_service(self):
        running, running_ip = self.launch("gpu-3")
        booting, booting_ip = self.launch("gpu-6")
        self.slurm(
            ("gpu-1", "down+cloud+powered_down", "hpctrain: resume failed: InsufficientInstanceCapacity: none", ""),
            ("gpu-2", "idle+drain+cloud", "hpctrain: spot interruption: terminate at 12:00", "10.0.0.2"),
            ("gpu-3", "allocated+drain+cloud", "hpctrain: spot rebalance recommendation", running_ip),
            ("gpu-4", "idle+drain+cloud+powered_down", "disk replacement (admin)", ""),
            ("gpu-5", "down+cloud", "Not responding", "10.0.0.5"),
            ("gpu-6", "idle+cloud+powering_up", "", booting_ip),
            ("gpu-7", "allocated+cloud", "", "10.0.0.7"),
            ("gpu-8", "down+drain+cloud", "broken GPU (admin)", "10.0.0.8"),
        )
        calls = self.run_pass()
        self.assertEqual(sorted(calls), [
            "update nodename=gpu-1 state=resume",
            "update nodename=gpu-2 state=power_down_force",
            "update nodename=gpu-5 state=power_down_force",
            "update nodename=gpu-7 state=down reason=hpctrain: instance gone",
        ])
        self.assertEqual(self.live(), {running, booting})  # gpu-3's jobs keep running; gpu-6 boots on

    def test_a_node_down_for_capacity_waits_for_a_cooldown_to_end(self):
        with hpc_cloud.State(self.cfg["state_file"]) as st:
            for itype in self.cfg["instance_types"]:
                st.cooldowns[hpc_cloud.cooldown_key(itype, "on-demand", None)] = time.time() + 600
        down = ("gpu-1", "down+cloud+powered_down", "hpctrain: resume failed: no capacity: every choice", "")
        self.slurm(down)
        self.assertEqual(self.run_pass(), [])
        with hpc_cloud.State(self.cfg["state_file"]) as st:
            st.cooldowns[hpc_cloud.cooldown_key("g5.12xlarge", "on-demand", None)] = time.time() - 1
        self.assertEqual(self.run_pass(), ["update nodename=gpu-1 state=resume"])
        with hpc_cloud.State(self.cfg["state_file"]) as st:
            self.assertEqual(list(st.cooldowns), [hpc_cloud.cooldown_key("p5.48xlarge", "on-demand", None)])

    def test_one_pass_at_a_time(self):
        self.slurm(("gpu-1", "down+cloud+powered_down", "hpctrain: resume failed: x", ""))
        import fcntl
        with open(self.cfg["state_file"] + ".clustermgtd.lock", "a", encoding="utf-8") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.assertEqual(self.run_pass(), [])
        self.assertEqual(self.run_pass(), ["update nodename=gpu-1 state=resume"])

    def test_bad_settings_are_one_line_and_exit_2(self):
        with open(self.config, "w", encoding="utf-8") as f:
            f.write("{}")
        r = subprocess.run([sys.executable, os.path.join(NODE_DIR, "clustermgtd.py")], capture_output=True, text=True,
                           check=False)
        self.assertEqual((r.returncode, len(r.stderr.splitlines())), (2, 1), r.stderr)
        self.assertIn("clustermgtd.py: error: ", r.stderr)


if __name__ == "__main__":
    unittest.main()

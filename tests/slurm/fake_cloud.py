"""The cloud for tests/slurm/power_saving.sh, on this machine: moto's EC2 as a server, and a
watcher that makes each instance tagged hpctrain:node a Slurm node here, the way an instance's
boot (join_compute.sh) does on AWS: it starts `slurmd -N NODE` when the instance is running and
stops it when the instance is terminated.

    fake_cloud.py server PORT [NO_CAPACITY_TYPE [QUOTA_FILE]]
                                              moto's server on 127.0.0.1:PORT (foreground); it
                                              refuses NO_CAPACITY_TYPE with InsufficientInstanceCapacity,
                                              and the launch of an instance tagged for a node named
                                              in QUOTA_FILE (when it exists, read at each launch)
                                              with VcpuLimitExceeded, as an account's quota would
    fake_cloud.py setup ENDPOINT CONFIG DIR [INSTANCE_TYPE...]
                                              a launch template; writes the programs' cloud.json
                                              (their state and heartbeat files in DIR)
    fake_cloud.py launch ENDPOINT NODE        an instance tagged for NODE, as if launched and lost
    fake_cloud.py nodes ENDPOINT SLURM_CONF   the watcher (foreground)
"""

import json
import os
import subprocess
import sys
import time

import boto3

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cloudformation"))
from cfn import amazon_images  # noqa: E402  (a few images, not moto's whole catalog)
from slurm_fakes import run_instances_giving_the_templates_profile  # noqa: E402

PROFILE = "local-compute"  # the compute instances' instance profile

REGION = "us-east-1"


def ec2(endpoint):
    return boto3.client("ec2", region_name=REGION, endpoint_url=endpoint)


def iam(endpoint):
    return boto3.client("iam", region_name=REGION, endpoint_url=endpoint)


def refuse_instance_type(no_capacity):
    """EC2 with no capacity for one instance type (as when a zone runs out of p5s)."""
    from moto.ec2.exceptions import EC2ClientError
    from moto.ec2.models.instances import InstanceBackend

    real = InstanceBackend.run_instances

    def run_instances(self, *args, **kwargs):
        if kwargs.get("instance_type") == no_capacity:
            raise EC2ClientError("InsufficientInstanceCapacity", f"We currently do not have sufficient {no_capacity} capacity")
        return real(self, *args, **kwargs)
    InstanceBackend.run_instances = run_instances


def refuse_nodes_over_quota(quota_file):
    """EC2 refusing the nodes QUOTA_FILE names (a line each): the account's vCPU quota is used up
    by the time their launches come."""
    from moto.ec2.exceptions import EC2ClientError
    from moto.ec2.models.instances import InstanceBackend

    real = InstanceBackend.run_instances

    def run_instances(self, *args, **kwargs):
        node = kwargs.get("tags", {}).get("instance", {}).get("hpctrain:node")
        try:
            with open(quota_file, encoding="utf-8") as f:
                refused = f.read().split()
        except FileNotFoundError:
            refused = []
        if node in refused:
            raise EC2ClientError("VcpuLimitExceeded", "You have requested more vCPU capacity than your current vCPU "
                                                      "limit allows")
        return real(self, *args, **kwargs)
    InstanceBackend.run_instances = run_instances


def server(port, no_capacity="", quota_file=""):
    from moto.server import ThreadedMotoServer

    from moto.ec2.models.instances import InstanceBackend

    if no_capacity:
        refuse_instance_type(no_capacity)
    if quota_file:
        refuse_nodes_over_quota(quota_file)
    InstanceBackend.run_instances = run_instances_giving_the_templates_profile(InstanceBackend.run_instances)
    s = ThreadedMotoServer(ip_address="127.0.0.1", port=int(port))
    s.start()
    while True:
        time.sleep(3600)


def setup(endpoint, config, state_dir, *instance_types):
    client = ec2(endpoint)
    ami = amazon_images(client)[0]
    profile = iam(endpoint).create_instance_profile(InstanceProfileName=PROFILE)["InstanceProfile"]["Arn"]
    lt = client.create_launch_template(LaunchTemplateName="compute",
                                       LaunchTemplateData={"ImageId": ami, "InstanceType": "g5.xlarge",
                                                           "IamInstanceProfile": {"Arn": profile}})
    with open(config, "w", encoding="utf-8") as f:
        json.dump({"cluster": "local", "region": REGION, "market": "on-demand", "controller": "localhost",
                   "instance_profile_arn": profile,
                   "launch_template_id": lt["LaunchTemplate"]["LaunchTemplateId"],
                   "instance_types": list(instance_types), "orphan_grace_seconds": 0,
                   "state_file": f"{state_dir}/cloud-state.json", "heartbeat_file": f"{state_dir}/heartbeat"}, f)


def launch(endpoint, node):
    client = ec2(endpoint)
    ami = amazon_images(client)[0]
    tags = [{"Key": "hpctrain:cluster", "Value": "local"}, {"Key": "hpctrain:node", "Value": node}]
    profile = iam(endpoint).get_instance_profile(InstanceProfileName=PROFILE)["InstanceProfile"]["Arn"]
    inst = client.run_instances(ImageId=ami, MinCount=1, MaxCount=1, InstanceType="g5.xlarge",
                                IamInstanceProfile={"Arn": profile},
                                TagSpecifications=[{"ResourceType": "instance", "Tags": tags}])["Instances"][0]
    print(inst["InstanceId"])


def node_addr(node):
    out = subprocess.run(["scontrol", "show", "node", node], capture_output=True, text=True, check=False).stdout
    return next((w.split("=", 1)[1] for w in out.split() if w.startswith("NodeAddr=")), "")


def nodes(endpoint, slurm_conf):
    client = ec2(endpoint)
    running = {}  # node -> slurmd process
    while True:
        live = set()
        for r in client.describe_instances(Filters=[{"Name": "instance-state-name", "Values": ["running"]}])["Reservations"]:
            for inst in r["Instances"]:
                tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
                if "hpctrain:node" in tags:
                    live.add(tags["hpctrain:node"])
        for node, proc in list(running.items()):
            # A slurmd that could not start (its port taken for a moment) is the instance's boot
            # failing: start it again rather than leave the node powering up for ever.
            if node in live and proc.poll() is not None:
                print(f"fake_cloud: {node}: slurmd exited ({proc.returncode}), starting it again", flush=True)
                del running[node]
        for node in live - set(running):
            # resume.py gave Slurm the instance's address; this "instance" is this machine.
            if node_addr(node) not in ("", node):
                subprocess.run(["scontrol", "update", f"nodename={node}", "nodeaddr=127.0.0.1",
                                "nodehostname=localhost"], check=False)
                # slurmctld takes a powering-up node's registration only from a machine that
                # booted after the resume request: a fresh instance has. This one runs slurmd in a
                # time namespace whose clock says it booted just now.
                time.sleep(3)  # booting: slurmd must come up seconds after the resume request
                with open("/proc/uptime", encoding="utf-8") as f:
                    uptime = int(float(f.read().split()[0]))  # the clock may not go below zero
                running[node] = subprocess.Popen(
                    ["unshare", "--fork", "--kill-child", "--time", "--boottime", str(-uptime),
                     "slurmd", "-D", "-f", slurm_conf, "-N", node],
                    stdout=subprocess.DEVNULL)  # its errors to the watcher's log
                print(f"fake_cloud: {node}: instance running, slurmd started", flush=True)
        for node in set(running) - live:
            running.pop(node).kill()
            print(f"fake_cloud: {node}: instance gone, slurmd stopped", flush=True)
        time.sleep(0.5)


if __name__ == "__main__":
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    {"server": server, "setup": setup, "launch": launch, "nodes": nodes}[sys.argv[1]](*sys.argv[2:])

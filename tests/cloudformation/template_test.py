"""cloudformation/cluster.yaml, offline: cfn-lint finds nothing, and the stack deploys into moto's
CloudFormation with only KeyName given (and again with spot on), with the resources the cluster
needs: encrypted EFS with a mount target per subnet, launch templates with IMDSv2 and their
market options, security groups open to the outside only for SSH from SshCidr, and IAM roles
whose policies name actions, not wildcards."""

import ast
import json
import os
import subprocess
import sys
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE = os.path.join(HERE, "..", "..", "cloudformation", "cluster.yaml")

try:
    import boto3
    from moto import mock_aws
except ImportError as e:  # pragma: no cover
    print(f"SKIPPED: {e} (boto3 and moto are needed)")
    sys.exit(77)

REGION = "us-east-1"
HEAD_AMI = "/aws/service/debian/release/12/latest/amd64"
COMPUTE_AMI = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"


def seed_public_parameter(name, value):
    """AWS publishes the images' SSM parameters in every account; moto ships only Amazon Linux's
    and refuses /aws/ names from users, so they go into its store the way it loads its own."""
    import datetime

    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.ssm.models import Parameter, ssm_backends

    store = ssm_backends[DEFAULT_ACCOUNT_ID][REGION]._parameters
    store[name].append(Parameter(account_id=DEFAULT_ACCOUNT_ID, name=name, value=value, parameter_type="String",
                                 description=None, allowed_pattern=None, keyid=None,
                                 last_modified_date=datetime.datetime.now(), version=1, data_type="aws:ec2:image"))


class Lint(unittest.TestCase):
    def test_cfn_lint_finds_nothing(self):
        r = subprocess.run([sys.executable, "-c", "import sys; from cfnlint.runner import main; sys.exit(main())",
                            TEMPLATE], capture_output=True, text=True, check=False)
        self.assertEqual((r.returncode, r.stdout + r.stderr), (0, ""))


class HeadNodeSettings(unittest.TestCase):
    """The settings file cfn-init writes for the power-saving programs is one they accept."""

    def test_cloud_json_loads(self):
        import re
        import tempfile

        from cfnlint.decode import decode

        sys.path.insert(0, os.path.join(HERE, "..", "..", "cloudformation", "node"))
        import hpc_cloud

        template, matches = decode(TEMPLATE)
        self.assertFalse(matches)
        files = template["Resources"]["HeadNode"]["Metadata"]["AWS::CloudFormation::Init"]["config"]["files"]
        text = files["/etc/hpctrain/cloud.json"]["content"]["Fn::Sub"]
        values = {"SpotFallback": "true", "Market": "spot"}
        text = re.sub(r"\$\{([^}]+)\}", lambda m: values.get(m.group(1), "x-" + m.group(1)), text)
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            f.write(text)
        self.addCleanup(os.unlink, f.name)
        cfg = hpc_cloud.load_config(f.name)
        self.assertEqual(cfg["launch_template_id"], "x-ComputeLaunchTemplate")
        self.assertEqual(cfg["fallback_launch_template_id"], "x-ComputeOnDemandLaunchTemplate")
        self.assertEqual((cfg["market"], cfg["spot_fallback"], cfg["subnet_ids"]), ("spot", True, []))


class Deploy(unittest.TestCase):
    def setUp(self):
        for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                     "AWS_DEFAULT_REGION": REGION}.items():
            self.enterContext(mock.patch.dict(os.environ, {k: v}))
        self.enterContext(mock_aws())
        self.ec2 = boto3.client("ec2", region_name=REGION)
        self.ec2.create_key_pair(KeyName="mykey")
        ami = self.ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        for name in (HEAD_AMI, COMPUTE_AMI):
            seed_public_parameter(name, ami)
        self.cfn = boto3.client("cloudformation", region_name=REGION)

    def deploy(self, **params):
        with open(TEMPLATE, encoding="utf-8") as f:
            body = f.read()
        parameters = [{"ParameterKey": "KeyName", "ParameterValue": "mykey"}]
        parameters += [{"ParameterKey": k, "ParameterValue": v} for k, v in params.items()]
        self.cfn.create_stack(StackName="hpc", TemplateBody=body, Parameters=parameters,
                              Capabilities=["CAPABILITY_IAM"])
        stack = self.cfn.describe_stacks(StackName="hpc")["Stacks"][0]
        self.assertEqual(stack["StackStatus"], "CREATE_COMPLETE", stack.get("StackStatusReason"))
        resources = self.cfn.describe_stack_resources(StackName="hpc")["StackResources"]
        # (moto lists resource types it does not model, such as SecurityGroupEgress, without ids)
        self.ids = {r["LogicalResourceId"]: r["PhysicalResourceId"] for r in resources if "PhysicalResourceId" in r}
        return stack

    def launch_template(self, logical):
        lt = self.ec2.describe_launch_template_versions(LaunchTemplateId=self.ids[logical])
        return lt["LaunchTemplateVersions"][0]["LaunchTemplateData"]

    def test_only_key_name_given(self):
        stack = self.deploy()
        outputs = {o["OutputKey"]: o["OutputValue"] for o in stack["Outputs"]}
        # (moto gives instances no public address, so HeadNodeAddress, !GetAtt HeadNode.PublicIp,
        # resolves to nothing there and is left out.)
        self.assertEqual(sorted(outputs), ["LoginAndSubmit", "SharedFileSystemId"])
        with open(TEMPLATE, encoding="utf-8") as f:
            self.assertIn("  HeadNodeAddress:\n    Description: Public address of the head node\n", f.read())
        self.assertIn("sbatch slurm/train.sbatch", outputs["LoginAndSubmit"])

        # Storage: encrypted EFS with a mount target in each subnet.
        efs = boto3.client("efs", region_name=REGION)
        fs = efs.describe_file_systems(FileSystemId=outputs["SharedFileSystemId"])["FileSystems"][0]
        self.assertTrue(fs["Encrypted"])
        targets = efs.describe_mount_targets(FileSystemId=fs["FileSystemId"])["MountTargets"]
        self.assertEqual(sorted(t["SubnetId"] for t in targets),
                         sorted([self.ids["PublicSubnet"], self.ids["PrivateSubnet"]]))

        # Compute: IMDSv2 required, on-demand (no market options), the DLAMI, in the private subnet.
        data = self.launch_template("ComputeLaunchTemplate")
        self.assertEqual(data["MetadataOptions"]["HttpTokens"], "required")
        self.assertNotIn("InstanceMarketOptions", data)
        self.assertEqual(data["InstanceType"], "g5.12xlarge")
        self.assertEqual(data["NetworkInterfaces"][0]["SubnetId"], self.ids["PrivateSubnet"])
        self.assertNotIn("InstanceMarketOptions", self.launch_template("ComputeOnDemandLaunchTemplate"))

        # Network: the only ingress from outside the cluster is SSH from SshCidr to the head node.
        groups = self.ec2.describe_security_groups(
            GroupIds=[self.ids[g] for g in ("HeadNodeSecurityGroup", "ComputeSecurityGroup", "StorageSecurityGroup")]
        )["SecurityGroups"]
        cidr_rules = [(g["GroupId"], p.get("FromPort"), r["CidrIp"])
                      for g in groups for p in g["IpPermissions"] for r in p.get("IpRanges", [])]
        self.assertEqual(cidr_rules, [(self.ids["HeadNodeSecurityGroup"], 22, "10.0.0.0/8")])
        compute = next(g for g in groups if g["GroupId"] == self.ids["ComputeSecurityGroup"])
        sources = {pair["GroupId"] for p in compute["IpPermissions"] for pair in p.get("UserIdGroupPairs", [])}
        self.assertEqual(sources, {self.ids["HeadNodeSecurityGroup"], self.ids["ComputeSecurityGroup"]})

        # IAM: the head node may run, tag and terminate instances, pass only the compute role, and
        # names every action (no wildcard actions).
        iam = boto3.client("iam", region_name=REGION)
        actions = {}
        for role in ("HeadNodeRole", "ComputeRole"):
            for name in iam.list_role_policies(RoleName=self.ids[role])["PolicyNames"]:
                doc = iam.get_role_policy(RoleName=self.ids[role], PolicyName=name)["PolicyDocument"]
                if isinstance(doc, str):  # moto returns a policy created by CloudFormation as Python's repr
                    doc = json.loads(doc) if doc.startswith('{"') else ast.literal_eval(doc)
                for st in doc["Statement"]:
                    for a in [st["Action"]] if isinstance(st["Action"], str) else st["Action"]:
                        actions.setdefault(role, set()).add(a)
                        self.assertNotIn("*", a, f"{role}/{name}: wildcard action {a}")
                    if st["Action"] == "iam:PassRole":
                        self.assertNotEqual(st["Resource"], "*")
        self.assertTrue({"ec2:RunInstances", "ec2:TerminateInstances", "ec2:CreateTags", "iam:PassRole",
                         "ec2:DescribeInstances"} <= actions["HeadNodeRole"])
        self.assertNotIn("ec2:RunInstances", actions["ComputeRole"])

    def test_spot(self):
        self.deploy(Market="spot", DataBucket="my-datasets", ResultsPrefix="results/")
        data = self.launch_template("ComputeLaunchTemplate")
        self.assertEqual(data["InstanceMarketOptions"]["MarketType"], "spot")
        self.assertNotIn("InstanceMarketOptions", self.launch_template("ComputeOnDemandLaunchTemplate"))
        iam = boto3.client("iam", region_name=REGION)
        policies = iam.list_role_policies(RoleName=self.ids["ComputeRole"])["PolicyNames"]
        self.assertIn("data", policies)


if __name__ == "__main__":
    unittest.main()

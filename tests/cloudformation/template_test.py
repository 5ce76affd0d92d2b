"""cloudformation/cluster.yaml, offline: cfn-lint finds nothing, and the stack deploys into moto's
CloudFormation with only KeyName given (and again with spot on), with the resources the cluster
needs: encrypted EFS with a mount target per subnet, kept when the stack is deleted unless told
otherwise; launch templates with IMDSv2, their market options and termination on shutdown; the
head node's metadata service one hop away; a generated munge key in Secrets Manager; security
groups open to the outside only for SSH from SshCidr; IAM roles whose policies name actions,
not wildcards; and the cleanup custom resource run (moto runs its code in-process here). What
the policies allow is policy_test.py's; the cleanup handler's work is cleanup_test.py's."""

import ast
import json
import os
import subprocess
import sys
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE = os.path.join(HERE, "..", "..", "cloudformation", "cluster.yaml")
sys.path.insert(0, HERE)

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
        import tempfile

        import cfn

        sys.path.insert(0, cfn.NODE_DIR)
        import hpc_cloud

        r = cfn.Resolved(cfn.load_template(), Market="spot", ComputeInstanceTypes="p5.48xlarge,p4d.24xlarge")
        files = r.resource("HeadNode")["Metadata"]["AWS::CloudFormation::Init"]["config"]["files"]
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            f.write(files["/etc/hpctrain/cloud.json"]["content"])
        self.addCleanup(os.unlink, f.name)
        cfg = hpc_cloud.load_config(f.name)
        self.assertEqual(cfg["cluster"], cfn.STACK)  # the tag value: the stack's name
        self.assertEqual(cfg["launch_template_id"], r.physical("ComputeLaunchTemplate"))
        self.assertEqual(cfg["fallback_launch_template_id"], r.physical("ComputeOnDemandLaunchTemplate"))
        self.assertEqual((cfg["market"], cfg["spot_fallback"], cfg["efa"]), ("spot", True, False))
        self.assertEqual(cfg["instance_types"], ["p5.48xlarge", "p4d.24xlarge"])
        self.assertEqual(cfg["subnet_ids"], [r.physical("PrivateSubnet")])
        self.assertEqual(cfg["security_group_ids"], [r.physical("ComputeSecurityGroup")])


class Resolved(unittest.TestCase):
    """What moto does not keep or cannot do (it leaves network interfaces behind and so cannot
    delete this stack), checked on the template resolved for given parameters."""

    def test_the_file_system_is_kept_unless_told_otherwise(self):
        import cfn

        template = cfn.load_template()
        for policy, kept in (("Retain", "SharedFileSystem"), ("Delete", "DisposableSharedFileSystem")):
            r = cfn.Resolved(template, **({"SharedStorageDeletionPolicy": policy} if policy == "Delete" else {}))
            made = [k for k, v in template["Resources"].items() if v["Type"] == "AWS::EFS::FileSystem" and r.exists(k)]
            self.assertEqual(made, [kept])
            res = template["Resources"][kept]
            self.assertEqual((res["DeletionPolicy"], res["UpdateReplacePolicy"]), (policy, policy))
            for target in ("PublicMountTarget", "PrivateMountTarget"):
                self.assertEqual(r.resource(target)["Properties"]["FileSystemId"], r.physical(kept))

    def test_head_node_metadata_service_is_one_hop(self):
        """Its firewall is imds_firewall_test.py's."""
        import cfn

        r = cfn.Resolved(cfn.load_template())
        options = r.resource("HeadNode")["Properties"]["MetadataOptions"]
        self.assertEqual((options["HttpTokens"], options["HttpPutResponseHopLimit"]), ("required", 1))


class MungeKey(unittest.TestCase):
    """The stack generates the munge key in Secrets Manager (moto's CloudFormation does not make
    secrets: checked on the template); fetch_munge_key.py installs it from there, against moto's
    Secrets Manager. Who may read it is policy_test.py's."""

    def test_generated_by_the_stack(self):
        import cfn

        secret = cfn.Resolved(cfn.load_template()).resource("MungeKey")
        self.assertEqual(secret["Type"], "AWS::SecretsManager::Secret")
        self.assertEqual(secret["Properties"]["GenerateSecretString"],
                         {"PasswordLength": 1024, "ExcludePunctuation": True, "IncludeSpace": False})

    def test_fetched_into_place(self):
        import tempfile

        import cfn

        sys.path.insert(0, cfn.NODE_DIR)
        import fetch_munge_key

        with mock.patch.dict(os.environ, {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}), \
                mock_aws(), tempfile.TemporaryDirectory() as d:
            sm = boto3.client("secretsmanager", region_name=REGION)
            arn = sm.create_secret(Name="hpc-MungeKey", SecretString="k" * 1024)["ARN"]
            short = sm.create_secret(Name="short", SecretString="k" * 31)["ARN"]
            out = os.path.join(d, "munge.key")
            for secret, code in ((arn, 0), (short, 1), ("arn:aws:secretsmanager:us-east-1:123456789012:secret:none", 1)):
                with mock.patch.object(sys, "argv", ["fetch_munge_key.py", "--secret", secret, "--region", REGION,
                                                     "--out", out]):
                    self.assertEqual(fetch_munge_key.main(), code)
            with open(out, encoding="utf-8") as f:
                self.assertEqual(f.read(), "k" * 1024)  # the refused ones did not replace it
            self.assertEqual(os.stat(out).st_mode & 0o777, 0o400)
            self.assertEqual(sorted(os.listdir(d)), ["munge.key"])


class Deploy(unittest.TestCase):
    def setUp(self):
        for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                     "AWS_DEFAULT_REGION": REGION}.items():
            self.enterContext(mock.patch.dict(os.environ, {k: v}))
        self.enterContext(mock_aws())
        import cfn

        self.custom_resources = self.enterContext(cfn.moto_runs_custom_resources(cfn.load_template()))
        self.ec2 = boto3.client("ec2", region_name=REGION)
        self.ec2.create_key_pair(KeyName="mykey")
        ami = self.ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        for name in (HEAD_AMI, COMPUTE_AMI):
            seed_public_parameter(name, ami)
        self.cfn = boto3.client("cloudformation", region_name=REGION)

    def deploy(self, **params):
        with open(TEMPLATE, encoding="utf-8") as f:
            body = f.read()
        import cfn

        # moto splits a CommaDelimitedList given, not its default (CloudFormation splits both):
        # the defaults of those are given as CloudFormation would take them.
        lists = {k: p["Default"] for k, p in cfn.load_template()["Parameters"].items() if p["Type"] == "CommaDelimitedList"}
        parameters = [{"ParameterKey": "KeyName", "ParameterValue": "mykey"}]
        parameters += [{"ParameterKey": k, "ParameterValue": v} for k, v in {**lists, **params}.items()]
        self.cfn.create_stack(StackName="hpc", TemplateBody=body, Parameters=parameters,
                              Capabilities=["CAPABILITY_IAM"])
        self.custom_resources.deliver()
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
        self.assertIn("sbatch /opt/hpctrain/src/slurm/train.sbatch", outputs["LoginAndSubmit"])

        # Storage: encrypted EFS with a mount target in each subnet.
        efs = boto3.client("efs", region_name=REGION)
        fs = efs.describe_file_systems(FileSystemId=outputs["SharedFileSystemId"])["FileSystems"][0]
        self.assertTrue(fs["Encrypted"])
        targets = efs.describe_mount_targets(FileSystemId=fs["FileSystemId"])["MountTargets"]
        self.assertEqual(sorted(t["SubnetId"] for t in targets),
                         sorted([self.ids["PublicSubnet"], self.ids["PrivateSubnet"]]))

        # Compute: IMDSv2 required, on-demand (no market options), the DLAMI, terminated when it
        # shuts itself down (its watchdog); the network comes with each request (resume.py).
        data = self.launch_template("ComputeLaunchTemplate")
        self.assertEqual(data["MetadataOptions"]["HttpTokens"], "required")
        self.assertNotIn("InstanceMarketOptions", data)
        self.assertEqual(data["InstanceType"], "g5.12xlarge")
        self.assertNotIn("NetworkInterfaces", data)
        for logical in ("ComputeLaunchTemplate", "ComputeOnDemandLaunchTemplate"):
            self.assertEqual(self.launch_template(logical)["InstanceInitiatedShutdownBehavior"], "terminate")
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

    def test_storage_deletion_policy(self):
        stack = self.deploy(SharedStorageDeletionPolicy="Delete")
        outputs = {o["OutputKey"]: o["OutputValue"] for o in stack["Outputs"]}
        self.assertEqual(outputs["SharedFileSystemId"], self.ids["DisposableSharedFileSystem"])
        self.assertNotIn("SharedFileSystem", self.ids)

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

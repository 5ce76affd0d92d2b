"""cloudformation/cluster.yaml, offline: cfn-lint finds nothing, and the stack deploys into moto's
CloudFormation with only KeyName given (and again with spot on), with the resources the cluster
needs: encrypted EFS with one mount target per zone, kept when the stack is deleted unless told
otherwise; launch templates with IMDSv2, their market options and termination on shutdown; the
head node's metadata service one hop away; a generated munge key in Secrets Manager; security
groups open to the outside only for SSH from SshCidr; IAM roles whose policies name actions,
not wildcards; and the cleanup custom resource run (moto runs its code in-process here). What
the policies allow is policy_test.py's; the cleanup handler's work is cleanup_test.py's."""

import ast
import io
import json
import os
import re
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
STACK_POLICY = os.path.join(HERE, "..", "..", "cloudformation", "stack-policy.json")
HEAD_AMI = "/aws/service/debian/release/12/latest/amd64"
COMPUTE_AMI = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
# The CloudWatch agent key's fingerprint as AWS publishes it: CloudWatch user guide, "Verifying the
# signature of the CloudWatch agent package" (key 3B789C72, "Amazon CloudWatch Agent").
AWS_CLOUDWATCH_AGENT_KEY = "937616F3450B7D806CBD9725D58167303B789C72"


# What an update does to an AWS::EC2::Instance, from "Update requires" of each property in
# CloudFormation's reference: a change to one of these replaces the instance (a new one, the old
# terminated: the head node's slurmctld queue and state are lost)...
INSTANCE_REPLACED_BY = ("AvailabilityZone", "BlockDeviceMappings", "CpuOptions", "ElasticGpuSpecifications",
                        "EnclaveOptions", "HibernationOptions", "HostResourceGroupArn", "ImageId", "Ipv6AddressCount",
                        "Ipv6Addresses", "KeyName", "LaunchTemplate", "LicenseSpecifications", "NetworkInterfaces",
                        "PlacementGroupName", "PrivateIpAddress", "SecurityGroups", "SubnetId")
# ... and to one of these stops and starts it (slurmctld restarts, running jobs' steps fail).
INSTANCE_INTERRUPTED_BY = ("Affinity", "EbsOptimized", "HostId", "InstanceType", "KernelId", "RamdiskId",
                           "Tenancy", "UserData")


def instance_update(before, after, logical):
    """'replace', 'interrupt' or 'modify' (or None: unchanged): what CloudFormation does to the
    instance `logical` going from the resolved template `before` to `after`."""
    old, new = before.resource(logical), after.resource(logical)
    changed = {k for k in set(old["Properties"]) | set(new["Properties"])
               if old["Properties"].get(k) != new["Properties"].get(k)}
    if changed & set(INSTANCE_REPLACED_BY):
        return "replace"
    if changed & set(INSTANCE_INTERRUPTED_BY):
        return "interrupt"
    return "modify" if changed or old.get("Metadata") != new.get("Metadata") else None


def stack_policy_allows(policy, action, logical):
    """A stack policy's verdict on one update action ("Update:Replace") of one resource: an
    explicit Deny wins, and what no Allow covers is denied (CloudFormation's rules)."""
    import fnmatch

    def covers(st):
        actions = [st["Action"]] if isinstance(st["Action"], str) else st["Action"]
        resources = [st["Resource"]] if isinstance(st["Resource"], str) else st["Resource"]
        return any(fnmatch.fnmatchcase(action, a) for a in actions) and \
            any(fnmatch.fnmatchcase(f"LogicalResourceId/{logical}", r) for r in resources)
    verdicts = {st["Effect"] for st in policy["Statement"] if covers(st)}
    return "Allow" in verdicts and "Deny" not in verdicts


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
        import cfn

        self.assertEqual(cfn.lint(TEMPLATE), (0, ""))


class Arns(unittest.TestCase):
    def test_nothing_is_appended_to_an_arn_that_ends_in_a_wildcard(self):
        """A log group's Arn attribute already ends in ':*': '${LogGroup.Arn}:log-stream:*' made
        'log-group:NAME:*:log-stream:*', an ARN of nothing (access held only through the group's
        own entry beside it). Every such attribute is used whole."""
        import cfn

        template = cfn.load_template()
        groups = [name for name, r in template["Resources"].items() if r["Type"] == "AWS::Logs::LogGroup"]
        self.assertTrue(groups)
        found = []

        def walk(node):
            if isinstance(node, dict):
                for key, value in node.items():
                    if key == "Fn::Sub":
                        text = value if isinstance(value, str) else value[0]
                        found.extend(text for g in groups if "${" + g + ".Arn}" in text)
                    walk(value)
            elif isinstance(node, list):
                for item in node:
                    walk(item)
        walk(template["Resources"])
        self.assertEqual(found, [])


class HeadNodeSettings(unittest.TestCase):
    """The settings file cfn-init writes for the power-saving programs is one they accept."""

    def test_cloud_json_loads(self):
        import tempfile

        import cfn

        sys.path.insert(0, cfn.NODE_DIR)
        import hpc_cloud

        r = cfn.Resolved(cfn.load_template(), Market="spot", ComputeInstanceTypes="p5.48xlarge,p4d.24xlarge")
        files = r.resource("HeadNode")["Metadata"]["AWS::CloudFormation::Init"]["settings"]["files"]
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            f.write(files["/etc/hpctrain/cloud.json"]["content"])
        self.addCleanup(os.unlink, f.name)
        cfg = hpc_cloud.load_config(f.name)
        self.assertEqual(cfg["cluster"], cfn.STACK)  # the tag value: the stack's name
        self.assertEqual(cfg["launch_template_id"], r.physical("ComputeLaunchTemplate"))
        self.assertEqual(cfg["fallback_launch_template_id"], r.physical("ComputeOnDemandLaunchTemplate"))
        self.assertEqual((cfg["market"], cfg["spot_fallback"], cfg["efa"]), ("spot", True, False))
        self.assertEqual(cfg["resume_timeout_seconds"], 1800)  # (ResumeTimeoutSeconds, as slurm.conf's ResumeTimeout)
        self.assertEqual(cfg["instance_types"], ["p5.48xlarge", "p4d.24xlarge"])
        self.assertEqual(cfg["subnet_ids"], [r.physical("PrivateSubnet"), r.physical("PrivateSubnet2")])
        self.assertEqual(cfg["security_group_ids"], [r.physical("ComputeSecurityGroup")])
        # The profile the programs count as the cluster's is the one both templates launch with.
        for template in ("ComputeLaunchTemplate", "ComputeOnDemandLaunchTemplate"):
            data = r.resource(template)["Properties"]["LaunchTemplateData"]
            self.assertEqual(cfg["instance_profile_arn"], data["IamInstanceProfile"]["Arn"])
        self.assertEqual(cfg["instance_profile_arn"], r.attribute("ComputeInstanceProfile", "Arn"))


    def settings_files(self, **params):
        import cfn

        r = cfn.Resolved(cfn.load_template(), **params)
        return r.resource("HeadNode")["Metadata"]["AWS::CloudFormation::Init"]

    def test_files_root_writes_are_root_s_alone(self):
        """Every file cfn-init writes (root's) is writable by root only; cfn-hup's (which name the
        stack) readable by root only."""
        init = self.settings_files()
        files = {path: f for key, config in init.items() if key != "configSets" for path, f in config.get("files", {}).items()}
        self.assertIn("/etc/hpctrain/cluster.env", files)
        for path, f in files.items():
            mode = int(f["mode"], 8)
            self.assertEqual(mode & 0o022, 0, f"{path}: mode {f['mode']}")
            self.assertNotIn("owner", f, path)  # cfn-init's default: root
            if path.startswith("/etc/cfn/"):
                self.assertEqual(mode & 0o077, 0, f"{path}: mode {f['mode']}")

    def test_an_update_applies_the_settings_without_the_bootstrap(self):
        """cfn-hup runs the "update" config set on a change of the head node's metadata: the
        settings rewritten and applied (apply_head_settings.sh: slurm.conf rendered again with the
        new values, slurmctld restarted) and the launches dry-run again (launch_check.py), never
        the bootstrap (which reinstalls /opt/hpctrain/src)."""
        import tempfile

        import cfn

        init = self.settings_files()
        self.assertEqual(init["configSets"], {"install": ["settings", "bootstrap"], "update": ["settings", "apply"]})
        hook = init["settings"]["files"]["/etc/cfn/hooks.d/hpctrain-settings.conf"]["content"]
        self.assertIn("path=Resources.HeadNode.Metadata.AWS::CloudFormation::Init\n", hook)
        self.assertIn("--resource HeadNode --configsets update ", hook)
        user_data = cfn.Resolved(cfn.load_template()).resource("HeadNode")["Properties"]["UserData"]
        self.assertIn("--configsets install ", user_data)
        # cfn-init runs a config's commands in the order of their names: the settings applied,
        # then the launches asked again, dry (as bootstrap_head.sh's last step does at creation).
        commands = [init["apply"]["commands"][name]["command"] for name in sorted(init["apply"]["commands"])]
        self.assertEqual(commands, ["/opt/hpctrain/src/cloudformation/node/apply_head_settings.sh",
                                    "python3 /opt/hpctrain/src/cloudformation/node/launch_check.py"])
        for command in commands:  # each names a program of this repository (/opt/hpctrain/src)
            program = command.split()[-1].replace("/opt/hpctrain/src/cloudformation/node", cfn.NODE_DIR)
            self.assertTrue(os.path.isfile(program), program)

        env = self.settings_files(MaxComputeNodes="7", ComputeGpus="8")["settings"]["files"]["/etc/hpctrain/cluster.env"]
        with tempfile.TemporaryDirectory() as d:
            run, path = self.fake_head(d, env["content"])
            r = subprocess.run(run, capture_output=True, text=True, env={**os.environ, **path}, check=False)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(os.path.join(d, "slurm", "slurm.conf"), encoding="utf-8") as f:
                conf = f.read()
            self.assertIn("NodeName=gpu-[1-7] ", conf)
            with open(os.path.join(d, "slurm", "gres.conf"), encoding="utf-8") as f:
                self.assertIn("File=/dev/nvidia[0-7]", f.read())
            with open(os.path.join(d, "systemctl.log"), encoding="utf-8") as f:
                self.assertEqual(f.read(), "enable slurmctld\nrestart slurmctld\n")
            r = subprocess.run(run + ["--bogus"], capture_output=True, text=True, env={**os.environ, **path}, check=False)
            self.assertEqual((r.returncode, r.stderr), (2, "apply_head_settings.sh: error: unknown argument '--bogus'\n"))

    def fake_head(self, d, env, ping="UP"):
        """apply_head_settings.sh's command line and PATH on a scratch head node in `d`: the settings
        file `env`, systemctl recording its calls, scontrol ping answering `ping` (UP or DOWN). A real
        slurmctld is head_settings_test.py's."""
        import cfn

        with open(os.path.join(d, "cluster.env"), "w", encoding="utf-8") as f:
            f.write(env)
        os.makedirs(os.path.join(d, "bin"))
        os.makedirs(os.path.join(d, "state"))
        fakes = {"systemctl": f'echo "$@" >> {d}/systemctl.log',
                 "scontrol": f'echo "$SLURM_CONF $*" >> {d}/scontrol.log; echo "Slurmctld(primary) at head is {ping}"'}
        for name, body in fakes.items():
            with open(os.path.join(d, "bin", name), "w", encoding="utf-8") as f:
                f.write(f"#!/bin/sh\n{body}\n")
            os.chmod(os.path.join(d, "bin", name), 0o755)
        run = [os.path.join(cfn.NODE_DIR, "apply_head_settings.sh"), "--env", os.path.join(d, "cluster.env"),
               "--out", os.path.join(d, "slurm"), "--state-dir", os.path.join(d, "state")]
        return run, {"PATH": f"{d}/bin:{os.environ['PATH']}"}

    def test_an_update_keeps_the_cluster_name_slurmctld_has(self):
        """ClusterName changed by an update: slurmctld's state names the cluster it was made for, and
        slurmctld would die at start under another name (head_settings_test.py shows it). slurm.conf
        keeps the state's name, the other settings are applied, and the script says so in one line
        and fails (cfn-hup logs it)."""
        import tempfile

        init = self.settings_files(ClusterName="renamed", MaxComputeNodes="7")
        with tempfile.TemporaryDirectory() as d:
            run, path = self.fake_head(d, init["settings"]["files"]["/etc/hpctrain/cluster.env"]["content"])
            with open(os.path.join(d, "state", "clustername"), "w", encoding="utf-8") as f:
                f.write("hpctrain")  # (as slurmctld 22.05 writes it: no newline)
            r = subprocess.run(run, capture_output=True, text=True, env={**os.environ, **path}, check=False)
            self.assertEqual((r.returncode, r.stdout), (1, ""), r.stderr)
            self.assertEqual(r.stderr, "apply_head_settings.sh: error: ClusterName 'renamed' refused: slurmctld's "
                             f"state ({d}/state) is cluster 'hpctrain', fixed at creation (slurmctld would not start "
                             "under another name); slurm.conf keeps 'hpctrain' and the other settings are applied: "
                             "give ClusterName 'hpctrain' back in the stack\n")
            with open(os.path.join(d, "slurm", "slurm.conf"), encoding="utf-8") as f:
                conf = f.read()
            self.assertIn("\nClusterName=hpctrain\n", conf)
            self.assertIn(f"\nStateSaveLocation={d}/state\n", conf)
            self.assertIn("NodeName=gpu-[1-7] ", conf)
            with open(os.path.join(d, "systemctl.log"), encoding="utf-8") as f:
                self.assertEqual(f.read(), "enable slurmctld\nrestart slurmctld\n")
            with open(os.path.join(d, "scontrol.log"), encoding="utf-8") as f:
                self.assertEqual(f.read(), f"{d}/slurm/slurm.conf ping\n")

    def test_an_update_fails_when_slurmctld_does_not_come_up(self):
        """The packaged unit is Type=simple: its restart succeeds even when slurmctld dies at once.
        The script asks slurmctld (scontrol ping) until --wait has passed, and fails in one line."""
        import tempfile

        env = self.settings_files()["settings"]["files"]["/etc/hpctrain/cluster.env"]["content"]
        with tempfile.TemporaryDirectory() as d:
            run, path = self.fake_head(d, env, ping="DOWN")
            r = subprocess.run(run + ["--wait", "2"], capture_output=True, text=True, env={**os.environ, **path},
                               check=False, timeout=60)
            self.assertEqual((r.returncode, r.stdout), (1, ""), r.stderr)
            self.assertEqual(r.stderr, "apply_head_settings.sh: error: slurmctld does not answer 2 s after its "
                             "restart: see 'journalctl -u slurmctld' and its log (SlurmctldLogFile in "
                             f"{d}/slurm/slurm.conf)\n")
            with open(os.path.join(d, "scontrol.log"), encoding="utf-8") as f:
                self.assertGreaterEqual(len(f.read().splitlines()), 2)  # asked again until --wait passed
            r = subprocess.run(run + ["--wait", "soon"], capture_output=True, text=True, env={**os.environ, **path},
                               check=False)
            self.assertEqual((r.returncode, r.stderr), (2, "apply_head_settings.sh: error: --wait takes whole seconds, "
                                                          "not 'soon'\n"))


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
            existing = cfn.Resolved(template, VpcId="vpc-0a", PublicSubnetId="subnet-0a", PrivateSubnetId="subnet-0b",
                                    **({"SharedStorageDeletionPolicy": policy} if policy == "Delete" else {}))
            self.assertEqual(existing.resource("HeadNodeZoneMountTarget")["Properties"]["FileSystemId"], r.physical(kept))

    def test_every_instance_requires_imdsv2_one_hop_and_encrypted_disposable_volumes(self):
        """IMDSv2 only, one hop (no container on the node reaches it), on every launch template and
        the head node, spot or not; every volume encrypted, and a compute instance's deleted with it.
        Who on the node reaches the metadata service is imds_firewall_test.py's."""
        import cfn

        template = cfn.load_template()
        for market in ("on-demand", "spot"):
            r = cfn.Resolved(template, Market=market)
            templates = [k for k, v in template["Resources"].items() if v["Type"] == "AWS::EC2::LaunchTemplate"]
            self.assertEqual(len(templates), 2)
            for logical in templates + ["HeadNode"]:
                props = r.resource(logical)["Properties"]
                data = props.get("LaunchTemplateData", props)
                with self.subTest(market=market, resource=logical):
                    options = data["MetadataOptions"]
                    self.assertEqual((options["HttpTokens"], options["HttpPutResponseHopLimit"], options["HttpEndpoint"]),
                                     ("required", 1, "enabled"))
                    self.assertTrue(data["BlockDeviceMappings"])
                    for mapping in data["BlockDeviceMappings"]:
                        self.assertIs(mapping["Ebs"]["Encrypted"], True)
                        self.assertIs(mapping["Ebs"].get("DeleteOnTermination", True), True)
                        if logical != "HeadNode":
                            self.assertIs(mapping["Ebs"]["DeleteOnTermination"], True)

    def test_a_compute_node_ships_its_logs_first_and_shuts_down_on_a_bootstrap_error(self):
        """Both launch templates' user data, run by bash in a scratch root with fake installers:
        the CloudWatch agent is set up before anything that can fail, and a failed step (here the
        packages' install, or hpctrain's fetch on the compute image) shuts the instance down (which
        the templates make a termination) instead of leaving it to bill until ResumeTimeout."""
        import tempfile

        import cfn

        r = cfn.Resolved(cfn.load_template())
        for logical in ("ComputeLaunchTemplate", "ComputeOnDemandLaunchTemplate"):
            script = r.resource(logical)["Properties"]["LaunchTemplateData"]["UserData"]
            for image, failing in ((False, "apt-get"), (True, "git")):
                with self.subTest(template=logical, image=image), tempfile.TemporaryDirectory() as root:
                    text = script
                    for path in ("/etc/hpctrain", "/opt/", "/var/log/hpctrain-bootstrap.log"):
                        text = text.replace(path, root + path)
                    fakes, log = os.path.join(root, "bin"), os.path.join(root, "calls")
                    agent = os.path.join(root, "opt/aws/amazon-cloudwatch-agent")
                    os.makedirs(os.path.join(agent, "etc"))
                    os.makedirs(os.path.join(agent, "bin"))
                    os.makedirs(fakes)
                    os.makedirs(os.path.join(root, "var/log"))
                    if image:
                        os.makedirs(os.path.join(root, "opt/hpctrain"), exist_ok=True)
                        open(os.path.join(root, "opt/hpctrain/image.json"), "w", encoding="utf-8").close()
                    ctl = os.path.join(agent, "bin", "amazon-cloudwatch-agent-ctl")
                    bodies = {
                        # the image has the agent; without it, the package (its signature taken as
                        # good here: CloudWatchAgent checks that) brings it
                        "dpkg": f'mkdir -p {os.path.dirname(ctl)}; printf "#!/bin/sh\\necho \\"amazon-cloudwatch-agent-ctl '
                                f'\\$*\\" >> {log}\\n" > {ctl}; chmod +x {ctl}',
                        "gpg": f'case "$*" in *--verify*) echo "[GNUPG:] VALIDSIG 00 {AWS_CLOUDWATCH_AGENT_KEY}";; esac',
                    }
                    names = ("curl", "dpkg", "gpg", "apt-get", "git", "sleep", "shutdown") + (("amazon-cloudwatch-agent-ctl",) if image else ())
                    for name in names:
                        where = os.path.join(agent, "bin") if name.endswith("-ctl") else fakes
                        code = 1 if name == failing else 0
                        with open(os.path.join(where, name), "w", encoding="utf-8") as f:
                            f.write(f'#!/bin/sh\necho "{name} $*" >> {log}\n{bodies.get(name, "")}\nexit {code}\n')
                        os.chmod(os.path.join(where, name), 0o755)
                    run = subprocess.run(["bash", "-c", text], capture_output=True, text=True, check=False, timeout=60,
                                         env={**os.environ, "PATH": f"{fakes}:{os.environ['PATH']}"})
                    with open(log, encoding="utf-8") as f:
                        calls = [line.split()[0] for line in f]
                    self.assertEqual(calls[-2:], ["sleep", "shutdown"], run.stdout + run.stderr)
                    with open(log, encoding="utf-8") as f:
                        self.assertTrue(f.read().endswith("sleep 60\nshutdown -h now\n"))
                    self.assertEqual(calls.count("shutdown"), 1)
                    self.assertIn(failing, calls)
                    self.assertLess(calls.index("amazon-cloudwatch-agent-ctl"), calls.index(failing))
                    installs = ["curl", "dpkg", "apt-get"]
                    self.assertEqual([c for c in calls if c in installs], [] if image else ["curl"] * 3 + ["dpkg", "apt-get"])
                    with open(os.path.join(agent, "etc", "amazon-cloudwatch-agent.json"), encoding="utf-8") as f:
                        streams = [c["log_stream_name"] for c in json.load(f)["logs"]["logs_collected"]["files"]["collect_list"]]
                    self.assertEqual(streams, ["{instance_id}/bootstrap", "{instance_id}/slurmd", "{instance_id}/syslog"])

    def test_the_cleanup_outlives_nothing_compute_instances_use(self):
        """On deletion CloudFormation deletes a resource only after everything that depends on it:
        whatever a compute instance uses (its launch templates and all they name, its subnet,
        security group, route out and mount target) must be a dependency of InstanceCleanup, so
        that it is deleted only after every instance is gone; and the head node (which launches
        them) depends on InstanceCleanup, so that it is gone first."""
        import cfn

        template = cfn.load_template()
        resources = template["Resources"]

        def direct(v):
            if isinstance(v, list):
                return set().union(*map(direct, v)) if v else set()
            if not isinstance(v, dict):
                return set()
            found = set()
            for k, x in v.items():
                if k == "Ref" and x in resources:
                    found.add(x)
                elif k == "Fn::GetAtt":
                    found.add(x.split(".")[0] if isinstance(x, str) else x[0])
                elif k == "Fn::Sub":
                    text = x if isinstance(x, str) else x[0]
                    found |= {n.split(".")[0] for n in re.findall(r"\$\{([^}!]+)\}", text)} & set(resources)
                    found |= direct(x[1]) if isinstance(x, list) else set()
                else:
                    found |= direct(x)
            return found

        def closure(names):
            seen, todo = set(), list(names)
            while todo:
                name = todo.pop()
                if name in seen:
                    continue
                seen.add(name)
                res = resources[name]
                depends = res.get("DependsOn", [])
                todo += direct(res.get("Properties", {})) | set([depends] if isinstance(depends, str) else depends)
            return seen

        launch_templates = [k for k, v in resources.items() if v["Type"] == "AWS::EC2::LaunchTemplate"]
        used = closure(launch_templates) | {"PrivateSubnet", "PrivateSubnet2", "PrivateSubnet3", "ComputeSecurityGroup",
                                            "PrivateRoute", "NatGateway", "PrivateMountTarget", "PrivateMountTarget2",
                                            "PrivateMountTarget3", "PublicMountTarget", "HeadNodeZoneMountTarget"}
        missing = used - closure(["InstanceCleanup"])
        self.assertEqual(missing, set())
        self.assertIn("InstanceCleanup", resources["HeadNode"]["DependsOn"])

    def test_the_compute_instance_profile_is_never_replaced(self):
        """The cluster terminates only instances with the compute instance profile's ARN (the
        policies' ec2:InstanceProfile condition, hpc_cloud's and the cleanup's filters): a new
        profile would leave the running compute instances, which carry the old ARN, foreign to the
        cluster and billed. The template gives it no property whose change replaces it
        (InstanceProfileName, Path: CloudFormation's rules) and the stack policy refuses its
        replacement and deletion; a change of its role is an update in place, which it allows."""
        import cfn

        self.assertEqual(set(cfn.load_template()["Resources"]["ComputeInstanceProfile"]["Properties"]), {"Roles"})
        with open(STACK_POLICY, encoding="utf-8") as f:
            policy = json.load(f)
        for action in ("Update:Replace", "Update:Delete"):
            self.assertFalse(stack_policy_allows(policy, action, "ComputeInstanceProfile"), action)
        self.assertTrue(stack_policy_allows(policy, "Update:Modify", "ComputeInstanceProfile"))


    def test_the_head_node_gets_a_public_address(self):
        """Without one it never reaches cfn-signal's endpoint (the stack waits 45 minutes): a new
        VPC's public subnet maps one at launch; in an existing VPC, whose public subnet may not,
        the head node asks for one on its interface."""
        import cfn

        template = cfn.load_template()
        r = cfn.Resolved(template)
        props = r.resource("HeadNode")["Properties"]
        self.assertEqual(props["SubnetId"], r.physical("PublicSubnet"))
        self.assertIs(r.resource("PublicSubnet")["Properties"]["MapPublicIpOnLaunch"], True)
        r = cfn.Resolved(template, VpcId="vpc-0a", PublicSubnetId="subnet-0a", PrivateSubnetId="subnet-0b")
        props = r.resource("HeadNode")["Properties"]
        self.assertNotIn("SubnetId", props)
        self.assertEqual(props["NetworkInterfaces"], [{"DeviceIndex": "0", "AssociatePublicIpAddress": True,
                                                       "DeleteOnTermination": True, "SubnetId": "subnet-0a",
                                                       "GroupSet": [r.physical("HeadNodeSecurityGroup")]}])

    def test_a_mount_target_in_every_zone_of_a_node(self):
        """EFS takes one mount target per zone: every compute subnet's zone and the head node's
        has exactly one (in a new VPC the second compute subnet shares the head node's zone and
        its mount target; an existing VPC's compute subnets each get their own, and the head
        node's, here in a zone of its own, gets one from HeadNodeZoneMountTarget, whose choice
        by zone Deploy's existing-VPC tests run against moto)."""
        import cfn

        template = cfn.load_template()
        existing = {"VpcId": "vpc-0a", "PublicSubnetId": "subnet-0a"}
        for params, zones in (({"ComputeZones": "1"}, 2), ({}, 2), ({"ComputeZones": "3"}, 3),
                              ({**existing, "PrivateSubnetId": "subnet-0b"}, 2),
                              ({**existing, "PrivateSubnetId": "subnet-0b,subnet-0c,subnet-0d"}, 4)):
            with self.subTest(params=params):
                r = cfn.Resolved(template, **params)

                def zone(subnet):  # a new VPC's subnet's zone; an existing VPC's subnets are each in their own
                    logical = next((k for k in template["Resources"] if r.exists(k) and r.physical(k) == subnet), None)
                    return r.resource(logical)["Properties"]["AvailabilityZone"] if logical else subnet
                mount_targets = [k for k, v in template["Resources"].items()
                                 if v["Type"] in ("AWS::EFS::MountTarget", "Custom::HeadNodeZoneMountTarget") and r.exists(k)]
                targets = [r.resource(k)["Properties"]["SubnetId"] for k in mount_targets]
                target_zones = [zone(t) for t in targets]
                self.assertEqual(len(set(target_zones)), len(target_zones), "two mount targets in one zone")
                self.assertEqual(len(target_zones), zones)
                head = r.resource("HeadNode")["Properties"]
                nodes = [head.get("SubnetId") or head["NetworkInterfaces"][0]["SubnetId"]]
                files = r.resource("HeadNode")["Metadata"]["AWS::CloudFormation::Init"]["settings"]["files"]
                nodes += json.loads(files["/etc/hpctrain/cloud.json"]["content"])["subnet_ids"]
                self.assertEqual({zone(n) for n in nodes} - set(target_zones), set())
                uses = set(r.resource("InstanceCleanup")["Properties"]["Uses"])
                # (deleted only after the compute instances: the cleanup names them)
                self.assertEqual(({r.physical(k) for k in mount_targets} | set(nodes[1:])) - uses, set())

    def test_every_compute_subnet_routes_out_through_the_nat_gateway(self):
        import cfn

        template = cfn.load_template()
        for zones in ("1", "2", "3"):
            r = cfn.Resolved(template, ComputeZones=zones)
            files = r.resource("HeadNode")["Metadata"]["AWS::CloudFormation::Init"]["settings"]["files"]
            subnets = json.loads(files["/etc/hpctrain/cloud.json"]["content"])["subnet_ids"]
            self.assertEqual(len(subnets), int(zones))
            routed = {r.resource(k)["Properties"]["SubnetId"] for k, v in template["Resources"].items()
                      if v["Type"] == "AWS::EC2::SubnetRouteTableAssociation" and r.exists(k)
                      and r.resource(k)["Properties"]["RouteTableId"] == r.physical("PrivateRouteTable")}
            self.assertEqual(routed, set(subnets), zones)
            self.assertEqual(r.resource("PrivateRoute")["Properties"]["NatGatewayId"], r.physical("NatGateway"))


class HeadNodeAptWaits(unittest.TestCase):
    """Every apt-get of the head node's boot waits for dpkg's lock (unattended-upgrades may hold
    it at first boot: a failure there fails the stack, or before cfn-signal is installed leaves it
    waiting 45 minutes): the user data's with the option, cfn-init's command's (and through
    APT_CONFIG, bootstrap_head.sh's and setup.sh's) with the configuration exported first."""

    def test_every_apt_get_waits_for_the_lock(self):
        import cfn

        head = cfn.load_template()["Resources"]["HeadNode"]
        user_data = head["Properties"]["UserData"]["Fn::Base64"]["Fn::Sub"]
        calls = re.findall(r"apt-get [^\n&]*", user_data)
        self.assertGreaterEqual(len(calls), 2)
        for call in calls:
            self.assertIn("-o DPkg::Lock::Timeout=600", call)
        command = head["Metadata"]["AWS::CloudFormation::Init"]["bootstrap"]["commands"]["01-bootstrap"]["command"]["Fn::Sub"][0]
        lines = command.splitlines()
        exported = lines.index("export APT_CONFIG")
        self.assertIn("echo 'DPkg::Lock::Timeout \"600\";' > \"$APT_CONFIG\"", lines[:exported])
        first_apt = next(i for i, line in enumerate(lines) if line.startswith("apt-get"))
        self.assertLess(exported, first_apt)
        self.assertLess(exported, lines.index("/opt/hpctrain/src/cloudformation/node/bootstrap_head.sh"))


class SharedMount(unittest.TestCase):
    """mount_shared.sh, run with stand-ins for mount, mountpoint, apt-get and git: /shared in
    fstab once, as efs-utils mounts it (tls,iam: the file-system policy refuses anything else),
    and efs-utils built from AWS's repository at the pinned tag where the image lacks it."""

    def run_it(self, have_efs_utils):
        import tempfile

        import cfn

        tmp = self.enterContext(tempfile.TemporaryDirectory())
        bin_dir, log = os.path.join(tmp, "bin"), os.path.join(tmp, "log")
        os.mkdir(bin_dir)
        fakes = {"mountpoint": "exit 1", "mount": f'echo "mount $*" >> {log}', "apt-get": f'echo "apt-get $*" >> {log}',
                 # git clone ... DIR: a checkout whose build-deb.sh makes the package
                 "git": f'echo "git $*" >> {log}; d="${{@: -1}}"; mkdir -p "$d/build"; '
                        f'printf "#!/bin/sh\ntouch build/amazon-efs-utils-1.36.0-1_all.deb\n" > "$d/build-deb.sh"; chmod +x "$d/build-deb.sh"'}
        if have_efs_utils:
            fakes["mount.efs"] = "exit 0"
        for name, body in fakes.items():
            with open(os.path.join(bin_dir, name), "w", encoding="utf-8") as f:
                f.write(f"#!/bin/bash\n{body}\n")
            os.chmod(os.path.join(bin_dir, name), 0o755)
        fstab, shared = os.path.join(tmp, "fstab"), os.path.join(tmp, "shared")
        with open(fstab, "w", encoding="utf-8") as f:
            f.write("LABEL=root / ext4 defaults 0 1\n")
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "EFS_ID": "fs-0123456789abcdef0", "FSTAB": fstab, "SHARED": shared}
        for _ in range(2):  # a second run (cfn-init again) adds nothing
            subprocess.run(["bash", os.path.join(cfn.NODE_DIR, "mount_shared.sh")], env=env, check=True, timeout=60)
        with open(fstab, encoding="utf-8") as f, open(log, encoding="utf-8") as g:
            return f.read().splitlines(), g.read().splitlines(), shared

    def test_mounted_with_tls_and_iam_once(self):
        fstab, log, shared = self.run_it(have_efs_utils=True)
        self.assertEqual(fstab[1:], [f"fs-0123456789abcdef0:/ {shared} efs _netdev,tls,iam 0 0"])
        self.assertEqual(log, [f"mount {shared}"] * 2)

    def test_a_file_system_that_never_mounts_is_an_error_not_an_endless_wait(self):
        import tempfile

        import cfn

        tmp = self.enterContext(tempfile.TemporaryDirectory())
        bin_dir = os.path.join(tmp, "bin")
        os.mkdir(bin_dir)
        for name, body in {"mountpoint": "exit 1", "mount": "exit 32", "mount.efs": "exit 0",
                           "sleep": f'echo "sleep $*" >> {tmp}/sleeps'}.items():
            with open(os.path.join(bin_dir, name), "w", encoding="utf-8") as f:
                f.write(f"#!/bin/bash\n{body}\n")
            os.chmod(os.path.join(bin_dir, name), 0o755)
        fstab = os.path.join(tmp, "fstab")
        open(fstab, "w", encoding="utf-8").close()
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "EFS_ID": "fs-0123456789abcdef0", "FSTAB": fstab,
               "SHARED": os.path.join(tmp, "shared"), "MOUNT_TRIES": "4"}
        r = subprocess.run(["bash", os.path.join(cfn.NODE_DIR, "mount_shared.sh")], env=env, capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(r.returncode, 1)
        self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)
        self.assertIn("cannot mount fs-0123456789abcdef0", r.stderr)
        self.assertIn("enableDnsSupport", r.stderr)
        with open(os.path.join(tmp, "sleeps"), encoding="utf-8") as f:
            self.assertEqual(f.read().splitlines(), ["sleep 5"] * 3)

    def test_efs_utils_built_at_the_pinned_tag(self):
        _, log, _ = self.run_it(have_efs_utils=False)
        clones = [line for line in log if line.startswith("git clone")]
        self.assertTrue(clones and all("--branch v1.36.0 https://github.com/aws/efs-utils " in c for c in clones), log)
        self.assertTrue(any(line.startswith("apt-get") and "amazon-efs-utils-1.36.0-1_all.deb" in line for line in log), log)


class CloudWatchAgent(unittest.TestCase):
    """The CloudWatch agent is installed only from a package that AWS's key signed: both
    node/install_cloudwatch_agent.sh (head node, compute image) and the compute user data's copy
    (Boot/CloudWatchAgent, run before the repository is fetched), each run with real gpg against
    a fake curl that serves a package signed by a key made here (its fingerprint put in place of
    AWS's), and a fake dpkg."""

    @classmethod
    def setUpClass(cls):
        import tempfile

        import cfn

        cls.tmp = tempfile.mkdtemp(prefix="cwagent-")
        cls.keys = {}
        for who in ("aws", "other"):
            home = os.path.join(cls.tmp, f"gnupg-{who}")
            os.mkdir(home, 0o700)
            subprocess.run(["gpg", "--batch", "--homedir", home, "--passphrase", "", "--pinentry-mode", "loopback",
                            "--quick-gen-key", f"{who} <{who}@example.com>", "ed25519", "sign", "never"],
                           check=True, capture_output=True, timeout=60)
            listing = subprocess.run(["gpg", "--batch", "--homedir", home, "--with-colons", "--list-keys"],
                                     check=True, capture_output=True, text=True).stdout
            fingerprint = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))
            cls.keys[who] = (home, fingerprint)
        script = os.path.join(cfn.NODE_DIR, "install_cloudwatch_agent.sh")
        with open(script, encoding="utf-8") as f:
            cls.script_text = f.read()
        cls.user_data_text = cfn.load_template()["Mappings"]["Boot"]["CloudWatchAgent"]["Script"]

    @classmethod
    def tearDownClass(cls):
        import shutil

        for home, _ in cls.keys.values():
            subprocess.run(["gpgconf", "--homedir", home, "--kill", "all"], check=False, capture_output=True)
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def serve(self, signer="aws", key_of="aws", tamper=False):
        """A directory of what the fake curl serves: the package, its detached signature by
        `signer`, and `key_of`'s public key as AWS's key file."""
        import tempfile

        served = tempfile.mkdtemp(dir=self.tmp)
        deb = os.path.join(served, "amazon-cloudwatch-agent.deb")
        with open(deb, "wb") as f:
            f.write(b"!<arch>\nthe agent's package\n")
        home, _ = self.keys[signer]
        subprocess.run(["gpg", "--batch", "--homedir", home, "--detach-sign", "-o", deb + ".sig", deb],
                       check=True, capture_output=True, timeout=60)
        if tamper:
            with open(deb, "ab") as f:
                f.write(b"changed on its way\n")
        with open(os.path.join(served, "amazon-cloudwatch-agent.gpg"), "wb") as f:
            f.write(subprocess.run(["gpg", "--batch", "--homedir", self.keys[key_of][0], "--armor", "--export"],
                                   check=True, capture_output=True).stdout)
        return served

    def install(self, text, served, *args):
        """Runs `text` (a script or the user data's lines) with AWS's fingerprint replaced by the
        test key's; returns (exit code, the fake curl's and dpkg's log, stderr)."""
        self.assertEqual(text.count(AWS_CLOUDWATCH_AGENT_KEY), 1, "AWS's published fingerprint, pinned once")
        run_dir = os.path.join(served, "run")
        bin_dir = os.path.join(run_dir, "bin")
        os.makedirs(bin_dir)
        log = os.path.join(run_dir, "log")
        fakes = {
            # curl ... -o OUT URL: the served file of the URL's last part
            "curl": f'out=; while (($#)); do [[ $1 == -o ]] && {{ out=$2; shift; }}; url=$1; shift; done; '
                    f'echo "curl $url" >> {log}; cp "{served}/${{url##*/}}" "$out"',
            "dpkg": f'echo "dpkg $*" >> {log}; cmp -s "${{@: -1}}" "{served}/amazon-cloudwatch-agent.deb" || echo "dpkg: another file" >> {log}',
        }
        for name, body in fakes.items():
            with open(os.path.join(bin_dir, name), "w", encoding="utf-8") as f:
                f.write(f"#!/bin/bash\n{body}\n")
            os.chmod(os.path.join(bin_dir, name), 0o755)
        path = os.path.join(run_dir, "install.sh")
        with open(path, "w", encoding="utf-8") as f:
            f.write("set -euo pipefail\n" + text.replace(AWS_CLOUDWATCH_AGENT_KEY, self.keys["aws"][1]) + "\n")
        r = subprocess.run(["bash", path, *args], env=dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}"),
                           capture_output=True, text=True, timeout=120)
        if not os.path.exists(log):
            return r.returncode, [], r.stderr
        with open(log, encoding="utf-8") as f:
            return r.returncode, f.read().splitlines(), r.stderr

    def each_installer(self):
        return (("install_cloudwatch_agent.sh", self.script_text, ("ubuntu",)),
                ("the compute user data", self.user_data_text, ()))

    def test_a_package_aws_signed_is_installed(self):
        for where, text, args in self.each_installer():
            with self.subTest(where=where):
                rc, log, err = self.install(text, self.serve(), *args)
                self.assertEqual(rc, 0, err)
                self.assertEqual([line.split()[0] for line in log], ["curl"] * 3 + ["dpkg"], log)
                self.assertTrue(log[0].endswith("/ubuntu/amd64/latest/amazon-cloudwatch-agent.deb"), log)
                self.assertTrue(log[1].endswith("amazon-cloudwatch-agent.deb.sig"), log)
                self.assertTrue(log[2].endswith("/assets/amazon-cloudwatch-agent.gpg"), log)
                self.assertTrue(log[3].startswith("dpkg -i "), log)

    def test_a_changed_package_or_another_key_is_refused(self):
        for where, text, args in self.each_installer():
            for case in ({"tamper": True}, {"signer": "other", "key_of": "other"}, {"signer": "other"}):
                with self.subTest(where=where, case=case):
                    rc, log, err = self.install(text, self.serve(**case), *args)
                    self.assertNotEqual(rc, 0)
                    self.assertFalse([line for line in log if line.startswith("dpkg")], log)
                    self.assertIn("is not signed by AWS's CloudWatch agent key", err)

    def test_every_download_of_the_agent_is_checked(self):
        import cfn

        for name in sorted(os.listdir(cfn.NODE_DIR)) + ["../cluster.yaml", "../image.yaml"]:
            path = os.path.join(cfn.NODE_DIR, name)
            if not os.path.isfile(path):
                continue
            with open(path, encoding="utf-8") as f:
                text = f.read()
            with self.subTest(name=name):
                if name == "install_cloudwatch_agent.sh":
                    continue
                if name == "../cluster.yaml":
                    text = text.replace(self.user_data_text, "")  # (its folded lines, as loaded)
                    text = re.sub(r"(?ms)^    CloudWatchAgent:\n      Script: >-\n(        .*\n)+", "", text)
                self.assertNotIn("amazon-cloudwatch-agent.deb", text, "the agent fetched without its signature checked")


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

    def test_a_secrets_manager_that_never_answers_fails_the_bootstrap_within_its_bound(self):
        """Against an endpoint that accepts and never answers: exit 1 and one error line naming
        it within the bound (hpc_cloud.aws_client; the timeouts shortened, see
        slurm_fakes.SHORT_TIMEOUTS_DRIVER), so that the bootstrap fails instead of hanging."""
        import tempfile

        from slurm_fakes import run_with_short_timeouts, silent_endpoint

        endpoint = silent_endpoint(self)
        env = dict(os.environ, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                   AWS_ENDPOINT_URL_SECRETS_MANAGER=endpoint)
        with tempfile.TemporaryDirectory() as d:
            r = run_with_short_timeouts(self, "fetch_munge_key.py", "--secret", "hpc-MungeKey", "--region", REGION,
                                        "--out", os.path.join(d, "munge.key"), env=env)
            self.assertEqual(os.listdir(d), [])
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)  # (not aws_client's log line too)
        self.assertTrue(r.stderr.startswith(f"fetch_munge_key.py: error: {endpoint} gave no answer within 2 s"), r.stderr)

    def test_an_ec2_that_never_answers_fails_the_export_with_one_line(self):
        """export_munge_key.py (the head node's bootstrap) against an EC2 endpoint that accepts and
        never answers: exit 1 and one error line naming it, within the bound."""
        import tempfile

        from slurm_fakes import run_with_short_timeouts, silent_endpoint

        endpoint = silent_endpoint(self)
        env = dict(os.environ, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_ENDPOINT_URL_EC2=endpoint)
        with tempfile.TemporaryDirectory() as d:
            config = os.path.join(d, "cloud.json")
            with open(config, "w", encoding="utf-8") as f:
                json.dump({"cluster": "hpc", "region": REGION, "launch_template_id": "lt-1", "subnet_ids": ["subnet-1"]}, f)
            r = run_with_short_timeouts(self, "export_munge_key.py", "--config", config, "--key", os.path.join(d, "k"),
                                        "--dir", os.path.join(d, "keys"), "--exports", os.path.join(d, "exports"), env=env)
            self.assertEqual(sorted(os.listdir(d)), ["cloud.json"])
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)
        self.assertTrue(r.stderr.startswith(f"export_munge_key.py: error: {endpoint} gave no answer within 2 s"), r.stderr)


    def test_served_to_the_compute_subnets_only(self):
        """export_munge_key.py, against moto's EC2 and a fake exportfs: the key copied root-only
        into the exported directory, which is exported read-only, from privileged ports only, to
        the compute subnets' ranges (from EC2) and nowhere else; a bad setting is one error line."""
        import tempfile

        import cfn

        sys.path.insert(0, cfn.NODE_DIR)
        import export_munge_key

        with mock.patch.dict(os.environ, {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}), \
                mock_aws(), tempfile.TemporaryDirectory() as d:
            ec2 = boto3.client("ec2", region_name=REGION)
            vpc = ec2.create_vpc(CidrBlock="10.42.0.0/16")["Vpc"]["VpcId"]
            subnets = [ec2.create_subnet(VpcId=vpc, CidrBlock=c)["Subnet"]["SubnetId"] for c in ("10.42.16.0/20", "10.42.32.0/20")]
            ec2.create_subnet(VpcId=vpc, CidrBlock="10.42.0.0/24")  # the head node's: not exported to
            key, keys, exports = (os.path.join(d, n) for n in ("munge.key", "keys", "exports.d/hpctrain-keys.exports"))
            with open(key, "w", encoding="utf-8") as f:
                f.write("k" * 1024)
            os.makedirs(os.path.join(d, "bin"))
            with open(os.path.join(d, "bin", "exportfs"), "w", encoding="utf-8") as f:
                f.write(f'#!/bin/sh\necho "$@" >> {d}/exportfs.log\n[ ! -e {d}/exportfs.fails ] || {{ echo "bad line" >&2; exit 1; }}\n')
            os.chmod(os.path.join(d, "bin", "exportfs"), 0o755)

            def run(subnet_ids):
                config = os.path.join(d, "cloud.json")
                with open(config, "w", encoding="utf-8") as f:
                    json.dump({"cluster": "hpc", "region": REGION, "launch_template_id": "lt-1", "subnet_ids": subnet_ids}, f)
                argv = ["export_munge_key.py", "--config", config, "--key", key, "--dir", keys, "--exports", exports]
                with mock.patch.object(sys, "argv", argv), \
                        mock.patch.dict(os.environ, {"PATH": f"{d}/bin:{os.environ['PATH']}"}), \
                        mock.patch("sys.stderr", new_callable=io.StringIO) as err:
                    return export_munge_key.main(), err.getvalue()

            self.assertEqual(run(subnets), (0, ""))
            with open(exports, encoding="utf-8") as f:
                self.assertEqual(f.read(), f"{keys} 10.42.16.0/20(ro,secure,no_root_squash,no_subtree_check,sec=sys) "
                                           f"10.42.32.0/20(ro,secure,no_root_squash,no_subtree_check,sec=sys)\n")
            self.assertEqual(os.stat(keys).st_mode & 0o777, 0o700)
            self.assertEqual(os.stat(os.path.join(keys, "munge.key")).st_mode & 0o777, 0o400)
            with open(os.path.join(keys, "munge.key"), encoding="utf-8") as f:
                self.assertEqual(f.read(), "k" * 1024)
            with open(os.path.join(d, "exportfs.log"), encoding="utf-8") as f:
                self.assertEqual(f.read(), "-ra\n")
            code, err = run([])
            self.assertEqual((code, err.count("\n")), (1, 1))
            self.assertIn("names no compute subnet", err)
            open(os.path.join(d, "exportfs.fails"), "w", encoding="utf-8").close()
            code, err = run(subnets)
            self.assertEqual((code, err), (1, "export_munge_key.py: error: exportfs -ra failed (1): bad line\n"))


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
        ami = cfn.amazon_images(self.ec2)[0]
        for name in (HEAD_AMI, COMPUTE_AMI):
            seed_public_parameter(name, ami)
        self.cfn = boto3.client("cloudformation", region_name=REGION)

    def deploy(self, StackPolicyBody=None, StackName="hpc", **params):  # noqa: N803 - CloudFormation's names
        with open(TEMPLATE, encoding="utf-8") as f:
            body = f.read()
        import cfn

        # moto splits a CommaDelimitedList given, not its default (CloudFormation splits both):
        # the defaults of those are given as CloudFormation would take them.
        lists = {k: p["Default"] for k, p in cfn.load_template()["Parameters"].items() if p["Type"] == "CommaDelimitedList"}
        parameters = [{"ParameterKey": "KeyName", "ParameterValue": "mykey"}]
        parameters += [{"ParameterKey": k, "ParameterValue": v} for k, v in {**lists, **params}.items()]
        self.cfn.create_stack(StackName=StackName, TemplateBody=body, Parameters=parameters,
                              Capabilities=["CAPABILITY_IAM"], **({"StackPolicyBody": StackPolicyBody} if StackPolicyBody else {}))
        self.custom_resources.deliver()
        stack = self.cfn.describe_stacks(StackName=StackName)["Stacks"][0]
        self.assertEqual(stack["StackStatus"], "CREATE_COMPLETE", stack.get("StackStatusReason"))
        resources = self.cfn.describe_stack_resources(StackName=StackName)["StackResources"]
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
        # The nodes' shape (g5.12xlarge: 48 vCPUs, 4 GPUs), not train.sbatch's 8 GPUs a node, which
        # Slurm would refuse (tests/slurm/rendered_conf.sh submits this line to a real slurmctld);
        # train.sbatch's 2 nodes, which MaxComputeNodes (4) allows.
        self.assertIn("sbatch --nodes=2 --ntasks-per-node=4 --gpus-per-node=4 --cpus-per-task=$((48/4)) "
                      "/opt/hpctrain/src/slurm/train.sbatch", outputs["LoginAndSubmit"])

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

    def created(self, logical):
        """A custom resource's answer at creation: (status, physical id, reason, event, data)."""
        return next(a for a in self.custom_resources.answers if a[3]["LogicalResourceId"] == logical)

    def images_update(self, template, before, after):
        """The Images custom resource's answer to the Update event CloudFormation sends it when
        its properties go from `before`'s to `after`'s (moto sends custom resources no updates)."""
        import cfn

        created = self.created("Images")
        event = {**created[3], "RequestType": "Update", "PhysicalResourceId": created[1],
                 "ResourceProperties": after.resource("Images")["Properties"],
                 "OldResourceProperties": before.resource("Images")["Properties"]}
        sent = []
        cfn.function_module(template, "ImagesFunction", sent).handler(event, cfn.LambdaContext())
        self.assertEqual(sent[0][0], "SUCCESS", sent[0][2])
        return sent[0][4]

    def test_an_update_keeps_the_head_node(self):
        """A newer image published in the images' SSM parameters and ComputeInstanceTypes changed:
        the update neither replaces nor restarts the head node, the images stay what they were,
        the head node's cloud.json (rewritten by cfn-hup) names the new type and its power-up is
        allowed. With RefreshImages the images are resolved again, and the stack policy refuses
        the head node's replacement that this would be."""
        import cfn
        import policy_test

        template = cfn.load_template()
        with open(STACK_POLICY, encoding="utf-8") as f:
            stack_policy = json.load(f)
        self.deploy(StackPolicyBody=json.dumps(stack_policy))
        created = self.created("Images")[4]
        amis = cfn.amazon_images(self.ec2, 2)
        ssm = boto3.client("ssm", region_name=REGION)
        at_create = {n: ssm.get_parameter(Name=n)["Parameter"]["Value"] for n in (HEAD_AMI, COMPUTE_AMI)}
        newer = next(a for a in amis if a != at_create[HEAD_AMI])
        for name in (HEAD_AMI, COMPUTE_AMI):
            seed_public_parameter(name, newer)
        with open(TEMPLATE, encoding="utf-8") as f:
            body = f.read()
        keep = [{"ParameterKey": "KeyName", "UsePreviousValue": True}]  # the others: defaults, as at creation
        self.enterContext(cfn.moto_keeps_what_it_cannot_update())
        self.cfn.update_stack(StackName="hpc", TemplateBody=body, Capabilities=["CAPABILITY_IAM"],
                              Parameters=keep + [{"ParameterKey": "ComputeInstanceTypes", "ParameterValue": "g6.12xlarge"}])
        stack = self.cfn.describe_stacks(StackName="hpc")["Stacks"][0]
        self.assertEqual(stack["StackStatus"], "UPDATE_COMPLETE", stack.get("StackStatusReason"))
        head = [r for r in self.cfn.describe_stack_resources(StackName="hpc")["StackResources"]
                if r.get("LogicalResourceId") == "HeadNode"]
        self.assertEqual([r["PhysicalResourceId"] for r in head], [self.ids["HeadNode"]])

        before = cfn.Resolved(template, custom={"Images": created}, ssm=at_create.get)
        images = self.images_update(template, before, cfn.Resolved(template, ComputeInstanceTypes="g6.12xlarge"))
        self.assertEqual(images, created)
        after = cfn.Resolved(template, custom={"Images": images}, ssm=lambda name: newer,
                             ComputeInstanceTypes="g6.12xlarge")
        self.assertEqual(instance_update(before, after, "HeadNode"), "modify")  # its cloud.json
        self.assertEqual(policy_test.head_node_config(after)["instance_types"], ["g6.12xlarge"])
        self.assertEqual(policy_test.failures(after, after.role_policies()), [])
        for what in ("Modify", "Replace"):
            self.assertTrue(stack_policy_allows(stack_policy, f"Update:{what}", "ComputeLaunchTemplate"))

        refreshed = self.images_update(template, before, cfn.Resolved(template, RefreshImages="2026-11-27"))
        self.assertEqual(refreshed, {"HeadNodeImage": newer, "ComputeImage": newer})
        again = cfn.Resolved(template, custom={"Images": refreshed}, RefreshImages="2026-11-27")
        self.assertEqual(instance_update(before, again, "HeadNode"), "replace")
        self.assertFalse(stack_policy_allows(stack_policy, "Update:Replace", "HeadNode"))
        self.assertTrue(stack_policy_allows(stack_policy, "Update:Modify", "HeadNode"))
        self.assertEqual(self.cfn.get_stack_policy(StackName="hpc").get("StackPolicyBody"), json.dumps(stack_policy))

    def test_an_update_cannot_change_the_cluster_name(self):
        """slurmctld keeps ClusterName in its state and would not start under another: the Images
        custom resource, which the head node and the launch templates wait for, refuses an update
        that changes it (the update then rolls back before the head node is touched), and takes the
        rollback's Update, which gives the name back. A stack created before the name was kept (its
        physical id without it) is not refused here: its head node keeps the name
        (apply_head_settings.sh)."""
        import cfn

        template = cfn.load_template()
        self.deploy()
        created = self.created("Images")
        self.assertEqual(created[1].split("|")[-1], "hpctrain")
        at_create = cfn.Resolved(template, custom={"Images": created[4]}).resource("Images")["Properties"]
        renamed = cfn.Resolved(template, ClusterName="renamed").resource("Images")["Properties"]

        def update(properties, old, physical=created[1]):
            event = {**created[3], "RequestType": "Update", "PhysicalResourceId": physical,
                     "ResourceProperties": properties, "OldResourceProperties": old}
            sent = []
            cfn.function_module(template, "ImagesFunction", sent).handler(event, cfn.LambdaContext())
            self.assertEqual(len(sent), 1)
            return sent[0]

        status, physical, reason, _, data = update(renamed, at_create)
        self.assertEqual((status, physical, data), ("FAILED", created[1], {}))
        self.assertEqual(reason, "ValueError: ClusterName is fixed at creation: slurmctld's state names the "
                                 "cluster 'hpctrain', and slurmctld would not start as 'renamed'; give ClusterName "
                                 "'hpctrain' back")
        # CloudFormation's rollback: the properties before the update, the failed ones as the old
        self.assertEqual(update(at_create, renamed)[:2], ("SUCCESS", created[1]))
        self.assertEqual(update(at_create, renamed)[4], created[4])
        # another change (RefreshImages) keeps the name in the physical id
        refreshed = cfn.Resolved(template, RefreshImages="2026-12-07").resource("Images")["Properties"]
        status, physical, *_ = update(refreshed, at_create)
        self.assertEqual((status, physical.split("|")[-1]), ("SUCCESS", "hpctrain"))
        # a stack made before the name was kept
        old_style = "|".join(created[1].split("|")[:3])
        self.assertEqual(update(renamed, at_create, physical=old_style)[:2], ("SUCCESS", old_style))

    def test_a_second_stack_with_the_defaults(self):
        """Two clusters with the defaults in one account and region: nothing of one is named from a
        parameter both share (the log group was named from ClusterName and the second failed)."""
        self.deploy()
        self.deploy(StackName="hpc2")  # (CREATE_COMPLETE, or it fails)
        groups = boto3.client("logs", region_name=REGION).describe_log_groups(logGroupNamePrefix="/hpctrain/")["logGroups"]
        ids = {s["StackName"]: s["StackId"].split("/")[2] for s in self.cfn.describe_stacks()["Stacks"]}
        self.assertEqual(sorted(g["logGroupName"] for g in groups), [f"/hpctrain/hpc/{ids['hpc']}",
                                                                      f"/hpctrain/hpc2/{ids['hpc2']}"])

    def test_the_log_group_outlives_a_failed_creation(self):
        """A creation that fails rolls back, deleting what it made: the log group, where the reason
        is (the head node's bootstrap, the launch check's), is kept, and so is it when the stack is
        deleted. A group kept from an earlier stack of the same name (failed, or deleted) does not
        stop the next one's creation: moto, as CloudFormation, fails a stack whose log group exists."""
        import cfn

        template = cfn.load_template()
        res = template["Resources"]["LogGroup"]
        self.assertEqual((res.get("DeletionPolicy"), res.get("UpdateReplacePolicy")), ("Retain", "Retain"))
        earlier = cfn.Resolved(template)
        earlier.pseudo["AWS::StackId"] = f"arn:aws:cloudformation:{REGION}:{cfn.ACCOUNT}:stack/hpc/0e0e0e0e-earlier"
        leftover = earlier.value(res["Properties"]["LogGroupName"])
        logs = boto3.client("logs", region_name=REGION)
        logs.create_log_group(logGroupName=leftover)
        try:
            self.deploy()  # (CREATE_COMPLETE, or it fails)
        except Exception as e:  # (moto answers the failed creation with an error of its own)
            self.fail(f"no stack hpc beside the log group {leftover} kept from an earlier one: {type(e).__name__}: {e}")
        groups = logs.describe_log_groups(logGroupNamePrefix="/hpctrain/hpc/")["logGroups"]
        groups = sorted(g["logGroupName"] for g in groups)
        stack_id = self.cfn.describe_stacks(StackName="hpc")["Stacks"][0]["StackId"]
        self.assertEqual(groups, sorted([leftover, f"/hpctrain/hpc/{stack_id.split('/')[2]}"]))

    def test_storage_deletion_policy(self):
        # (and CPU-only compute nodes, at most one, in the same deployment: the sample job asks for
        # no GPU, and for the one node; asked for two, sbatch refuses it on such a cluster)
        stack = self.deploy(SharedStorageDeletionPolicy="Delete", ComputeGpus="0", ComputeCpus="16", MaxComputeNodes="1")
        outputs = {o["OutputKey"]: o["OutputValue"] for o in stack["Outputs"]}
        self.assertEqual(outputs["SharedFileSystemId"], self.ids["DisposableSharedFileSystem"])
        self.assertNotIn("SharedFileSystem", self.ids)
        self.assertIn("sbatch --nodes=1 --ntasks-per-node=1 --gpus-per-node=0 --cpus-per-task=16 "
                      "/opt/hpctrain/src/slurm/train.sbatch", outputs["LoginAndSubmit"])

    def described_mount_targets(self):
        efs = boto3.client("efs", region_name=REGION)
        fs = self.ids.get("SharedFileSystem") or self.ids["DisposableSharedFileSystem"]
        return efs.describe_mount_targets(FileSystemId=fs)["MountTargets"]

    def mount_targets(self):
        return {t["SubnetId"]: t["AvailabilityZoneName"] for t in self.described_mount_targets()}

    def test_three_zones(self):
        """A new VPC's compute subnets in three zones, each zone with one mount target (moto
        refuses a second in a zone, as EFS does)."""
        self.deploy(ComputeZones="3")
        private = [self.ids[k] for k in ("PrivateSubnet", "PrivateSubnet2", "PrivateSubnet3")]
        subnets = {s["SubnetId"]: s["AvailabilityZone"] for s in self.ec2.describe_subnets(SubnetIds=private)["Subnets"]}
        self.assertEqual(len(set(subnets.values())), 3)
        targets = self.mount_targets()
        self.assertEqual(len(targets), 3)
        self.assertEqual(set(subnets.values()), set(targets.values()))
        table = self.ec2.describe_route_tables(RouteTableIds=[self.ids["PrivateRouteTable"]])["RouteTables"][0]
        # (moto records no subnet's route table association: Resolved checks them on the template)

    def existing_vpc(self, *zone_numbers):
        """Subnets of a new VPC made outside the stack, one in each zone numbered."""
        vpc = self.ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
        zones = [z["ZoneName"] for z in self.ec2.describe_availability_zones()["AvailabilityZones"]]
        return vpc, [self.ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.9.{i}.0/24", AvailabilityZone=zones[z])["Subnet"]["SubnetId"]
                     for i, z in enumerate(zone_numbers)]

    def head_zone_target(self, request, physical, before, after, **planted):
        """The HeadNodeZoneMountTarget function's answer (status, physical id, reason) to a request
        CloudFormation sends it (moto sends custom resources no updates, and cannot delete this stack),
        with the function's own functions named in `planted` replaced."""
        import cfn

        event = {**self.created("HeadNodeZoneMountTarget")[3], "RequestType": request, "PhysicalResourceId": physical,
                 "ResourceProperties": after, "OldResourceProperties": before}
        sent = []
        function = cfn.function_module(cfn.load_template(), "MountTargetFunction", sent)
        function.__dict__.update(planted)
        function.handler(event, cfn.LambdaContext())
        return sent[0][:3]

    def test_an_existing_vpc(self):
        """Into an existing VPC (subnets in three zones): each subnet gets its mount target, the
        head node's from HeadNodeZoneMountTarget, which deletes it again with the stack."""
        vpc, (public, *private) = self.existing_vpc(0, 1, 2)
        self.deploy(VpcId=vpc, PublicSubnetId=public, PrivateSubnetId=",".join(private))
        targets = self.mount_targets()
        self.assertEqual(sorted(targets), sorted([public, *private]))
        self.assertNotIn("Vpc", self.ids)
        status, target, _, event, _ = self.created("HeadNodeZoneMountTarget")
        self.assertEqual((status, target), ("SUCCESS", next(t["MountTargetId"] for t in self.described_mount_targets()
                                                            if t["SubnetId"] == public)))
        props = event["ResourceProperties"]
        # An update that changes nothing of it keeps it; one that puts a compute subnet in its zone
        # deletes it (that subnet's own is made after it); the stack's deletion deletes it.
        self.assertEqual(self.head_zone_target("Update", target, props, props), ("SUCCESS", target, ""))
        moved = {**props, "ComputeSubnetIds": [private[0], self.ec2.create_subnet(
            VpcId=vpc, CidrBlock="10.9.9.0/24", AvailabilityZone=targets[public])["Subnet"]["SubnetId"]]}
        status, physical, reason = self.head_zone_target("Update", target, props, moved)
        self.assertEqual((status, reason), ("SUCCESS", ""))
        self.assertFalse(physical.startswith("fsmt-"), physical)
        self.assertEqual(sorted(self.mount_targets()), sorted(private))
        status, physical, _ = self.head_zone_target("Update", physical, moved, props)
        self.assertEqual(status, "SUCCESS")
        self.assertEqual(sorted(self.mount_targets()), sorted([public, *private]))
        # A mount target that never becomes available fails the update, and is not left behind.
        self.assertEqual(self.head_zone_target("Update", physical, props, moved)[0], "SUCCESS")
        def error_state(efs, target):
            return "error" if target in [t["MountTargetId"] for t in self.described_mount_targets()] else "deleted"
        status, _, reason = self.head_zone_target("Update", "none-x", moved, props, state=error_state)
        self.assertEqual(status, "FAILED")
        self.assertIn("is error", reason)
        self.assertEqual(sorted(self.mount_targets()), sorted(private))
        status, physical, _ = self.head_zone_target("Update", "none-x", moved, props)
        self.assertEqual(status, "SUCCESS")
        # PrivateSubnetId's list, which the template cannot count: a fourth subnet was passed over
        # without a word; two in one zone failed on EFS's MountTargetConflict.
        fourth = self.ec2.create_subnet(VpcId=vpc, CidrBlock="10.9.8.0/24", AvailabilityZone=targets[private[0]])["Subnet"]["SubnetId"]
        for compute, error in ((private + [self.existing_vpc(3)[1][0], fourth], "PrivateSubnetId names 4 subnets; the cluster takes 1 to 3"),
                               ([private[0], fourth], f"PrivateSubnetId's {private[0]} and {fourth} are both in {targets[private[0]]}")):
            status, _, reason = self.head_zone_target("Update", physical, props, {**props, "ComputeSubnetIds": compute})
            self.assertEqual(status, "FAILED", compute)
            self.assertIn(error, reason)
        self.assertEqual(sorted(self.mount_targets()), sorted([public, *private]))
        self.assertEqual(self.head_zone_target("Delete", physical, {}, props), ("SUCCESS", physical, ""))
        self.assertEqual(sorted(self.mount_targets()), sorted(private))
        self.assertEqual(self.head_zone_target("Delete", physical, {}, props)[0], "SUCCESS")  # (again: CloudFormation retries)

    def test_an_existing_vpc_whose_public_subnet_shares_a_zone(self):
        """The usual VPC: a public and a private subnet in each zone. The head node's zone has a
        compute subnet, whose mount target the head node uses (before, a second mount target in
        that zone failed the stack with EFS's MountTargetConflict)."""
        vpc, (public, *private) = self.existing_vpc(0, 0, 1)
        self.deploy(VpcId=vpc, PublicSubnetId=public, PrivateSubnetId=",".join(private))
        targets = self.mount_targets()
        self.assertEqual(sorted(targets), sorted(private))
        zone = {s["SubnetId"]: s["AvailabilityZone"] for s in self.ec2.describe_subnets(SubnetIds=[public])["Subnets"]}
        self.assertIn(zone[public], targets.values())
        status, physical, _, _, _ = self.created("HeadNodeZoneMountTarget")
        self.assertEqual(status, "SUCCESS")
        self.assertFalse(physical.startswith("fsmt-"), physical)
        # (moto's head node ignores its NetworkInterfaces: its public address is checked on the
        # template, Resolved.test_the_head_node_gets_a_public_address)

    def test_spot(self):
        self.deploy(Market="spot", DataBucket="my-datasets", ResultsPrefix="results/")
        data = self.launch_template("ComputeLaunchTemplate")
        self.assertEqual(data["InstanceMarketOptions"]["MarketType"], "spot")
        self.assertNotIn("InstanceMarketOptions", self.launch_template("ComputeOnDemandLaunchTemplate"))
        iam = boto3.client("iam", region_name=REGION)
        self.assertEqual(sorted(iam.list_role_policies(RoleName=self.ids["ComputeRole"])["PolicyNames"]),
                         ["compute-node", "data-role"])
        self.assertEqual(sorted(iam.list_role_policies(RoleName=self.ids["DataRole"])["PolicyNames"]), ["data", "results"])


if __name__ == "__main__":
    unittest.main()

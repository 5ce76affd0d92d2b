"""The compute image, offline: cloudformation/image.yaml (EC2 Image Builder) and the install both
paths share, cloudformation/node/prepare_compute.sh.

moto models no Image Builder resources (no moto.imagebuilder), so the stack is not deployed:
cfn-lint checks it against CloudFormation's schemas; the component document is parsed as AWSTOE
reads it (its phases and steps, its fetch the same as cluster.yaml's boot fetch, the revision
pinned), and its fetch and marker check run against a local repository; the build instance's
role is evaluated with policy_test.py's evaluator (it may do what Image Builder's agent does and
nothing more, each statement's scope checked by mutation); and
prepare_compute.sh's decision is run in a fake /opt/hpctrain with fake apt-get, dpkg, curl, cmake,
git and setup.sh: nothing installed on an image of the node's revision, everything on any other
(no marker, another revision, an unreadable one), no marker left by a failed install.
"""

import copy
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
ROOT = os.path.join(HERE, "..", "..")
IMAGE = os.path.join(ROOT, "cloudformation", "image.yaml")
PREPARE = os.path.join(ROOT, "cloudformation", "node", "prepare_compute.sh")
JOIN = os.path.join(ROOT, "cloudformation", "node", "join_compute.sh")

try:
    import yaml
    import cfnlint.decode  # noqa: F401 - cfn.load_template and cfn.lint use it
except ImportError as e:  # pragma: no cover
    print(f"SKIPPED: {e} (cfn-lint and PyYAML are needed)")
    sys.exit(77)

import cfn  # noqa: E402
import policy_test  # noqa: E402


class Lint(unittest.TestCase):
    def test_cfn_lint_finds_nothing(self):
        self.assertEqual(cfn.lint(IMAGE), (0, ""))


class Stack(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.template = cfn.load_template(IMAGE)
        cls.r = cfn.Resolved(cls.template, HpctrainRevision="v1.2.3")
        cls.cluster = cfn.load_template()

    def document(self):
        return yaml.safe_load(self.r.resource("Component")["Properties"]["Data"])

    def step(self, phase, name):
        phases = {p["name"]: p for p in self.document()["phases"]}
        return next(s for s in phases[phase]["steps"] if s["name"] == name)

    def test_the_component_document_is_one_awstoe_runs(self):
        doc = self.document()
        self.assertEqual(doc["schemaVersion"], 1.0)
        names = [p["name"] for p in doc["phases"]]
        self.assertIn("build", names)
        self.assertLessEqual(set(names), {"build", "validate", "test"})
        for phase in doc["phases"]:
            for s in phase["steps"]:
                self.assertRegex(s["name"], r"^[A-Za-z][A-Za-z0-9]*$")
                self.assertEqual(s["action"], "ExecuteBash")
                self.assertTrue(all(isinstance(c, str) and c for c in s["inputs"]["commands"]))

    def test_the_build_fetches_the_pinned_revision_as_the_cluster_does(self):
        """The component's fetch is cluster.yaml's boot fetch, word for word, given the revision."""
        self.assertEqual(self.template["Mappings"]["Boot"]["Install"], self.cluster["Mappings"]["Boot"]["Install"])
        fetch = self.step("build", "Fetch")["inputs"]["commands"][0]
        self.assertIn("REVISION='v1.2.3'\n", fetch)
        self.assertIn(self.cluster["Mappings"]["Boot"]["Install"]["Script"], fetch)
        self.assertTrue(fetch.startswith("set -euo pipefail\n"))
        # The revision as the cluster takes it: a tag or a full commit id, never a branch.
        for key in ("AllowedPattern", "Default"):
            self.assertEqual(self.template["Parameters"]["HpctrainRevision"][key],
                             self.cluster["Parameters"]["HpctrainRevision"][key])

    def test_the_build_runs_the_install_of_the_boot_and_checks_its_marker(self):
        prepare = self.step("build", "Prepare")["inputs"]["commands"]
        # Always installs (never --if-needed: the parent image has no marker to trust).
        self.assertEqual(prepare, ["bash /opt/hpctrain/src/cloudformation/node/prepare_compute.sh 'v1.2.3'"])
        marker = self.step("validate", "Marker")["inputs"]["commands"][0]
        self.assertIn("/opt/hpctrain/image.json 'v1.2.3'", marker)

    def test_the_build_steps_run(self):
        """The Fetch step as AWSTOE runs it (bash), with /opt/hpctrain moved into a temporary
        directory and a fake apt-get, against a local repository tagged v1.2.3; then the validate
        step's marker check, against a marker of this revision and of another."""
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        repo, home, bin_dir = (os.path.join(tmp, d) for d in ("repo", "opt/hpctrain", "bin"))
        env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
                   GIT_COMMITTER_EMAIL="t@t", PATH=f"{bin_dir}:{os.environ['PATH']}")
        os.makedirs(repo)
        os.makedirs(bin_dir)
        executable(os.path.join(bin_dir, "apt-get"), "true")
        for args in (["init", "-q"], ["commit", "-q", "--allow-empty", "-m", "r"], ["tag", "v1.2.3"]):
            subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True, env=env)
        r = cfn.Resolved(self.template, HpctrainRevision="v1.2.3", HpctrainRepository=repo)
        phases = {p["name"]: p for p in yaml.safe_load(r.resource("Component")["Properties"]["Data"])["phases"]}
        fetch = phases["build"]["steps"][0]["inputs"]["commands"][0].replace("/opt/hpctrain", home)
        run = subprocess.run(["bash", "-c", fetch], capture_output=True, text=True, env=env, check=False)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn("hpctrain v1.2.3 (", run.stdout)
        self.assertTrue(os.path.isdir(os.path.join(home, "src", ".git")))
        check = phases["validate"]["steps"][0]["inputs"]["commands"][0].splitlines()[1:3]
        check = "\n".join(check).replace("/opt/hpctrain", home)
        for revision, code in (("v1.2.3", 0), ("v1.2.2", 1)):
            with open(os.path.join(home, "image.json"), "w", encoding="utf-8") as f:
                json.dump({"revision": revision}, f)
            run = subprocess.run(["bash", "-c", check], capture_output=True, text=True, check=False)
            self.assertEqual(run.returncode, code, run.stderr)

    def test_the_image_is_built_from_the_clusters_compute_image_and_is_the_output(self):
        self.assertEqual(self.template["Parameters"]["ParentImage"]["Default"],
                         self.cluster["Parameters"]["ComputeAmi"]["Default"])
        self.assertRegex(self.cluster["Parameters"]["ComputeAmi"]["AllowedPattern"].replace("\\", ""), "ami-")
        recipe = self.r.resource("ImageRecipe")["Properties"]
        self.assertEqual(recipe["ParentImage"], self.r.params["ParentImage"])
        self.assertEqual(recipe["Components"], [{"ComponentArn": self.r.ref("Component")}])
        for m in recipe["BlockDeviceMappings"]:
            self.assertTrue(m["Ebs"]["Encrypted"])
            self.assertTrue(m["Ebs"]["DeleteOnTermination"])
            self.assertLessEqual(m["Ebs"]["VolumeSize"], 200)  # the cluster's launch templates' volume
        self.assertEqual(self.template["Outputs"]["ComputeImage"]["Value"], {"Fn::GetAtt": ["Image", "ImageId"]})

    def test_the_build_instance_is_imdsv2_only_and_never_left_running(self):
        infra = self.r.resource("InfrastructureConfiguration")["Properties"]
        self.assertEqual(infra["InstanceMetadataOptions"], {"HttpTokens": "required", "HttpPutResponseHopLimit": 1})
        self.assertIs(infra["TerminateInstanceOnFailure"], True)
        self.assertEqual(infra["InstanceProfileName"], self.r.ref("BuildInstanceProfile"))


# ------------------------------------------------------------------ the build instance's role
def build_role_cases(r):
    """(what, role, [(action, resource, context)], allowed?) as policy_test.cases gives them."""
    arn = lambda service, rest: f"arn:aws:{service}:{cfn.REGION}:{cfn.ACCOUNT}:{rest}"  # noqa: E731
    component = r.ref("Component")
    other_component = arn("imagebuilder", "component/someone-else/1.0.0/1")
    toe = "arn:aws:s3:::ec2imagebuilder-toe-us-east-1-prod/latest/linux/amd64/awstoe"
    logs = arn("logs", "log-group:/aws/imagebuilder/hpc-hpctrain-compute:log-stream:1.0.0/1")
    yes = [
        ("the SSM agent registers", [("ssm:UpdateInstanceInformation", arn("ec2", "instance/i-0b"), {})]),
        ("Run Command reaches the agent", [(f"ec2messages:{a}", "*", {}) for a in
                                            ("GetEndpoint", "GetMessages", "AcknowledgeMessage", "SendReply",
                                             "DeleteMessage", "FailMessage")]),
        ("its channel", [(f"ssmmessages:{a}", "*", {}) for a in
                         ("CreateControlChannel", "CreateDataChannel", "OpenControlChannel", "OpenDataChannel")]),
        ("AWSTOE reads this component", [("imagebuilder:GetComponent", component, {})]),
        ("AWSTOE is downloaded", [("s3:GetObject", toe, {})]),
        ("the build logs", [(f"logs:{a}", logs, {}) for a in ("CreateLogGroup", "CreateLogStream", "PutLogEvents")]),
    ]
    no = [
        ("another component", [("imagebuilder:GetComponent", other_component, {})]),
        ("changing this one", [("imagebuilder:DeleteComponent", component, {})]),
        ("making images", [("imagebuilder:CreateImage", arn("imagebuilder", "image-recipe/x/1.0.0"), {})]),
        ("another bucket", [("s3:GetObject", "arn:aws:s3:::hpc-data/secret", {})]),
        ("writing Image Builder's bucket", [("s3:PutObject", toe, {})]),
        ("another log group", [("logs:PutLogEvents", arn("logs", "log-group:hpc-cluster:log-stream:x"), {})]),
        ("deleting the build logs", [("logs:DeleteLogGroup", logs, {})]),
        ("commands to other instances", [("ssm:SendCommand", arn("ec2", "instance/i-0other"), {})]),
        ("parameters", [("ssm:GetParameter", arn("ssm", "parameter/secret"), {})]),
        ("secrets", [("secretsmanager:GetSecretValue", arn("secretsmanager", "secret:hpc-MungeKey-AbCdEf"), {})]),
        ("instances", [("ec2:RunInstances", arn("ec2", "instance/*"), {})]),
        ("tags", [("ec2:CreateTags", arn("ec2", "image/ami-0a"), {})]),
        ("roles", [("iam:PassRole", f"arn:aws:iam::{cfn.ACCOUNT}:role/admin", {})]),
    ]
    return [(w, "BuildRole", c, True) for w, c in yes] + [(w, "BuildRole", c, False) for w, c in no]


def build_role_failures(r, policies):
    bad = []
    for what, role, checks, expected in build_role_cases(r):
        got = all(policy_test.allowed(policies.get(role, []), *c) for c in checks)
        if got != expected:
            bad.append(f"{what}: {'allowed' if got else 'refused'}")
    return bad


class BuildRole(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.template = cfn.load_template(IMAGE)
        cls.r = cfn.Resolved(cls.template)

    def test_the_build_instance_may_do_what_image_builder_needs_and_nothing_else(self):
        policies = self.r.role_policies()
        self.assertEqual(sorted(policies), ["BuildRole"])
        self.assertEqual(build_role_failures(self.r, policies), [])
        role = self.template["Resources"]["BuildRole"]["Properties"]
        self.assertNotIn("ManagedPolicyArns", role)  # e.g. AmazonSSMManagedInstanceCore: ssm:* on *
        self.assertNotIn("PermissionsBoundary", role)
        profile = self.template["Resources"]["BuildInstanceProfile"]["Properties"]
        self.assertEqual(profile["Roles"], [{"Ref": "BuildRole"}])

    def test_every_statement_is_checked(self):
        policies = self.r.role_policies()
        uncaught, tried = [], 0
        for i, statement in enumerate(policies["BuildRole"]):
            for what, mutated in policy_test.mutations(statement):
                planted = copy.deepcopy(policies)
                planted["BuildRole"][i] = mutated
                tried += 1
                if not build_role_failures(self.r, planted):
                    uncaught.append(f"{statement.get('Sid', i)} {what}")
        self.assertEqual(uncaught, [], "\n".join(uncaught))
        self.assertGreaterEqual(tried, 4)


# ------------------------------------------------------------------ the decision at boot
FAKE = {
    "apt-get": 'echo "apt-get $* (config: $(cat "$APT_CONFIG"))" >> "$LOG"',
    "dpkg": 'echo "dpkg $*" >> "$LOG"',
    "curl": 'echo "curl $*" >> "$LOG"',
    "cmake": 'echo "cmake $*" >> "$LOG"',
    "git": 'echo 0123456789abcdef0123456789abcdef01234567',
}
SETUP = ('echo "setup.sh BUILD_DIR=$BUILD_DIR CMAKE_ARGS=$CMAKE_ARGS" >> "$LOG"; mkdir -p "$BUILD_DIR"\n'
         'exit "${SETUP_FAILS:-0}"\n')


def executable(path, body):
    with open(path, "w", encoding="utf-8") as f:
        f.write("#!/bin/bash\n" + body + "\n")
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


class BootDecision(unittest.TestCase):
    """prepare_compute.sh --if-needed, as join_compute.sh runs it, copied into a fake
    /opt/hpctrain/src (its marker and build beside it), with fake installers on PATH."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.tmp)
        self.home = os.path.join(self.tmp, "opt", "hpctrain")
        node = os.path.join(self.home, "src", "cloudformation", "node")
        os.makedirs(node)
        shutil.copy(PREPARE, node)
        shutil.copy(os.path.join(os.path.dirname(PREPARE), "install_efs_utils.sh"), node)
        # (the agent's signature check is template_test.py's CloudWatchAgent)
        executable(os.path.join(node, "install_cloudwatch_agent.sh"), 'echo "install_cloudwatch_agent.sh $*" >> "$LOG"')
        self.script = os.path.join(node, "prepare_compute.sh")
        executable(os.path.join(self.home, "src", "setup.sh"), SETUP)
        bin_dir = os.path.join(self.tmp, "bin")
        os.makedirs(bin_dir)
        for name, body in FAKE.items():
            executable(os.path.join(bin_dir, name), body)
        # (efs-utils there already: install_efs_utils.sh's build is mount_shared's test's)
        executable(os.path.join(bin_dir, "mount.efs"), "#!/bin/sh\nexit 0\n")
        self.log = os.path.join(self.tmp, "log")
        self.marker = os.path.join(self.home, "image.json")
        self.env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", LOG=self.log)

    def write_marker(self, text):
        with open(self.marker, "w", encoding="utf-8") as f:
            f.write(text)

    def run_prepare(self, *args, **env):
        r = subprocess.run(["bash", self.script, *args], capture_output=True, text=True, check=False,
                           env=dict(self.env, **env), timeout=60)
        if not os.path.exists(self.log):
            return r, ""
        with open(self.log, encoding="utf-8") as f:
            return r, f.read()

    def marker_revision(self):
        with open(self.marker, encoding="utf-8") as f:
            return json.load(f)["revision"]

    def assertInstalled(self, r, log, revision):
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn('apt-get install -y -q git gpg nfs-common slurmd munge libpmix2 python3-boto3 nftables', log)
        self.assertIn("install_cloudwatch_agent.sh ubuntu", log)
        # every apt-get waits for dpkg's lock (setup.sh's too: APT_CONFIG is inherited)
        for line in log.splitlines():
            if line.startswith("apt-get"):
                self.assertIn('DPkg::Lock::Timeout "600";', line)
        build = os.path.join(self.home, "build")
        self.assertIn(f"setup.sh BUILD_DIR={build} CMAKE_ARGS=-DHPCTRAIN_CUDA=ON", log)
        self.assertIn(f"cmake --install {build} --prefix /usr/local", log)
        self.assertEqual(self.marker_revision(), revision)
        with open(self.marker, encoding="utf-8") as f:
            self.assertEqual(json.load(f)["commit"], FAKE["git"].split()[1])

    def test_an_image_of_this_revision_installs_nothing(self):
        self.write_marker('{"revision": "v1.2.3", "commit": "abc"}\n')
        r, log = self.run_prepare("--if-needed", "v1.2.3")
        self.assertEqual((r.returncode, log), (0, ""), r.stderr)
        self.assertIn("nothing to install", r.stdout)
        self.assertEqual(self.marker_revision(), "v1.2.3")

    def test_an_image_without_the_marker_installs_everything(self):
        r, log = self.run_prepare("--if-needed", "v1.2.3")
        self.assertInstalled(r, log, "v1.2.3")

    def test_an_image_of_another_revision_installs_this_one(self):
        self.write_marker('{"revision": "v1.2.2", "commit": "abc"}\n')
        r, log = self.run_prepare("--if-needed", "v1.2.3")
        self.assertInstalled(r, log, "v1.2.3")

    def test_an_unreadable_marker_is_no_image(self):
        self.write_marker('{"revision": "v1.2.3"')  # cut short
        r, log = self.run_prepare("--if-needed", "v1.2.3")
        self.assertInstalled(r, log, "v1.2.3")

    def test_the_image_build_always_installs(self):
        self.write_marker('{"revision": "v1.2.3", "commit": "abc"}\n')
        r, log = self.run_prepare("v1.2.3")
        self.assertInstalled(r, log, "v1.2.3")

    def test_a_failed_install_leaves_no_marker(self):
        """Else a reboot would trust a half-installed node (or one of the old revision)."""
        self.write_marker('{"revision": "v1.2.2", "commit": "abc"}\n')
        r, _ = self.run_prepare("--if-needed", "v1.2.3", SETUP_FAILS="1")
        self.assertNotEqual(r.returncode, 0)
        self.assertFalse(os.path.exists(self.marker))

    def test_bad_usage_is_one_line_and_exit_2(self):
        # (an option it does not have, --help after --if-needed: no REVISION, nothing installed)
        for args in ((), ("--if-needed",), ("",), ("a", "b"), ("--bogus",), ("--if-needed", "--help"), ("-x", "v1")):
            with self.subTest(args=args):
                r, log = self.run_prepare(*args)
                self.assertEqual((r.returncode, log, r.stdout), (2, "", ""))
                self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)
                self.assertIn("usage", r.stderr)

    def test_help_installs_nothing(self):
        for flag in ("--help", "-h"):
            with self.subTest(flag=flag):
                r, log = self.run_prepare(flag)
                self.assertEqual((r.returncode, log, r.stderr), (0, "", ""))
                self.assertIn("usage: prepare_compute.sh [--if-needed] REVISION", r.stdout)
                self.assertFalse(os.path.exists(self.marker))

    def test_efs_utils_installer_takes_no_arguments(self):
        """Run by hand with --help it installed packages; now any argument is a usage error,
        before it looks for mount.efs (none on this PATH: it would install)."""
        script = os.path.join(os.path.dirname(PREPARE), "install_efs_utils.sh")
        env = dict(self.env, PATH=f"{os.path.join(self.tmp, 'bin')}:/usr/bin:/bin")
        os.remove(os.path.join(self.tmp, "bin", "mount.efs"))
        r = subprocess.run(["bash", script, "--help"], capture_output=True, text=True, check=False, env=env, timeout=60)
        self.assertEqual((r.returncode, r.stdout, os.path.exists(self.log)), (2, "", False), r.stderr)
        self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)
        self.assertIn("usage: install_efs_utils.sh", r.stderr)


class BootPath(unittest.TestCase):
    """The boot uses that decision: join_compute.sh installs only through prepare_compute.sh
    --if-needed with the cluster's revision, and the user data skips its package installs on an image."""

    def test_join_compute_installs_only_through_the_decision(self):
        with open(JOIN, encoding="utf-8") as f:
            code = [line for line in f if not line.lstrip().startswith("#")]
        calls = [line.strip() for line in code if "prepare_compute.sh" in line]
        self.assertEqual(calls, ['bash "$node_dir/prepare_compute.sh" --if-needed "$REVISION"'])
        for word in ("setup.sh", "apt-get", "cmake"):
            self.assertFalse([line for line in code if word in line], f"join_compute.sh runs {word} itself")
        # ... before slurmd starts
        text = "".join(code)
        self.assertLess(text.index("prepare_compute.sh"), text.index("systemctl enable slurmd"))

    def test_every_curl_has_a_time_bound(self):
        """A stalled or unreachable endpoint (the metadata service, S3) fails a bootstrap within
        curl's bounds instead of hanging it until ResumeTimeout or the stack's signal timeout:
        every curl of the node scripts and of the templates' scripts has --max-time (and
        --connect-timeout). (join_compute.sh's against a silent server: 27 s, as it states.)"""
        node = os.path.join(ROOT, "cloudformation", "node")
        files = [os.path.join(node, f) for f in sorted(os.listdir(node)) if f.endswith(".sh")]
        files += [os.path.join(ROOT, "cloudformation", f) for f in ("cluster.yaml", "image.yaml")]
        seen = 0
        for path in files:
            with open(path, encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    code = line.split("#")[0] if line.lstrip().startswith("#") or " # " in line else line
                    if not re.search(r"(^|[;(|&{])\s*curl\s+-", code):  # curl run, not the package
                        continue
                    seen += 1
                    with self.subTest(file=os.path.basename(path), line=number):
                        self.assertIn("--max-time", code, f"{path}:{number}: curl without --max-time: {line.strip()}")
                        self.assertIn("--connect-timeout", code, f"{path}:{number}: {line.strip()}")
        self.assertGreaterEqual(seen, 7)  # join_compute.sh's one, the agent's three twice

    def test_the_user_data_installs_packages_only_without_the_image(self):
        r = cfn.Resolved(cfn.load_template())
        for logical in ("ComputeLaunchTemplate", "ComputeOnDemandLaunchTemplate"):
            with self.subTest(logical):
                user_data = r.resource(logical)["Properties"]["LaunchTemplateData"]["UserData"]
                self.assertIn("REVISION='v0.1.0'", user_data)  # join_compute.sh's $REVISION
                guarded, depth = [], 0
                for line in user_data.splitlines():
                    line = line.strip()
                    if line == "if [ ! -e /opt/hpctrain/image.json ]; then":
                        depth += 1
                    elif line == "fi" and depth:
                        depth -= 1
                    elif re.match(r"^(apt-get|dpkg|curl)\b", line):
                        guarded.append((line.split()[0], depth > 0))
                self.assertEqual(sorted(set(guarded)), [("apt-get", True)])
                # the CloudWatch agent (Boot/CloudWatchAgent, one folded line): only where the image lacks it
                agent = cfn.load_template()["Mappings"]["Boot"]["CloudWatchAgent"]["Script"]
                self.assertIn(agent, user_data)
                self.assertTrue(agent.startswith("if [ ! -x /opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl ]; "
                                                 "then "), agent)
                self.assertTrue(agent.endswith(" fi"), agent)


if __name__ == "__main__":
    unittest.main()

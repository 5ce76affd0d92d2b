"""The stack's parameters, and what reaches a shell: every free-text parameter has an
AllowedPattern (or AllowedValues), which refuses each malformed value in a table and every
character a shell or a JSON string would act on; the Rules refuse subnets without their VPC and
a VPC without its subnets; in every shell script the template holds (user data, cfn-init's
commands, the settings file root sources) each substituted value is inside single quotes, except
the boot script, which is a constant of the template; and that boot script, run against a local
git repository, installs a commit id only if it is what was fetched and a tag as a tag (not a
branch of that name), into a tree that only root may write."""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import cfn  # noqa: E402

# Malformed values of each free-text parameter (each must be refused), and one good one.
MALFORMED = {
    "SshCidr": ["0.0.0.0/0", "10.0.0.0/7", "10.0.0.1", "10.0.0.0/33", "10.0.0.0/8; id", "a.b.c.d/8", ""],
    "VpcId": ["vpc-", "vpc-XYZ", "subnet-0a", "vpc-0a b", "vpc-0a'"],
    "PublicSubnetId": ["subnet-", "subnet-0A", "vpc-0a", "subnet-0a;id"],
    "PrivateSubnetId": ["subnet-", "subnet-0A", "vpc-0a", "subnet-0a$(id)", "subnet-0a,vpc-0b", "subnet-0a;subnet-0b"],
    "VpcCidr": ["10.42.0.0/8", "10.42.0.0/25", "10.42.0.0", "10.42.0.0/16\n"],
    "PublicSubnetCidr": ["10.42.0.0/29", "10.42.0.0/15", "x"],
    "PrivateSubnetCidr": ["10.42.0.0/29", "10.42.0.0/15", "x"],
    "PrivateSubnet2Cidr": ["10.42.0.0/29", "10.42.0.0/15", "x"],
    "PrivateSubnet3Cidr": ["10.42.0.0/29", "10.42.0.0/15", "x"],
    "ClusterName": ["Hpc", "1hpc", "hpc_train", "a" * 32, "", "hpc;id"],
    "HeadNodeInstanceType": ["c6i", "C6i.xlarge", "c6i.xlarge;id", ".xlarge", "c6i..xlarge"],
    "ComputeInstanceTypes": ["g5", "G5.12xlarge", "g5.12xlarge ", "g5.12xlarge;reboot", ""],
    "HpctrainRepository": ["http://github.com/x/y.git", "https://github.com/x/y.git'; id; '", "git@github.com:x/y.git",
                           "https://github.com/x y.git", "https://github.com", "file:///etc", "https://host/$(id)",
                           "https://host/a`id`", "https://host/a\nb", "https://host/a\\b", "https://host/a\"b"],
    "HpctrainRevision": ["main", "HEAD", "v1", "v1.2", "v1.2.3-rc1", "0123abc", "0" * 39, "0" * 41, "G" * 40,
                         "v1.2.3'", "v1.2.3;id", "refs/tags/v1.2.3", ""],
    "DataBucket": ["My-Bucket", "a", "-bucket", "bucket-", "bucket/prefix", "bucket*", "bucket name"],
    "ResultsPrefix": ["results", "/results/", "results/*", "res*/", "a b/", "a'b/", "../"[:-1] + "$/"],
    "HeadNodeAmi": ["", "ami-", "ami-XYZ12345", "ami-0123", "aws/service/x", "/aws/service/x;id", "/aws//x", "/a b"],
    "ComputeAmi": ["", "ami-0123456789abcdef01", "/aws/service/x'", "/aws/service/$(id)", "latest"],
    "RefreshImages": ["a b", "2026/11/27", "x;id", "a" * 65],
}
GOOD = {"SshCidr": "203.0.113.7/32", "VpcId": "vpc-0a1b", "PublicSubnetId": "subnet-0a1b", "PrivateSubnetId": "subnet-0c",
        "VpcCidr": "10.1.0.0/16", "PublicSubnetCidr": "10.1.0.0/24", "PrivateSubnetCidr": "10.1.16.0/20",
        "PrivateSubnet2Cidr": "10.1.32.0/20", "PrivateSubnet3Cidr": "10.1.48.0/20",
        "ClusterName": "my-cluster", "HeadNodeInstanceType": "m7i-flex.large", "ComputeInstanceTypes": "p4d.24xlarge",
        "HpctrainRepository": "https://git.example.org:8443/team/hpctrain.git", "HpctrainRevision": "0123456789abcdef0123456789abcdef01234567",
        "DataBucket": "my.datasets-1", "ResultsPrefix": "results/run_1/", "HeadNodeAmi": "ami-0123456789abcdef0",
        "ComputeAmi": "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id",
        "RefreshImages": "2026-11-27"}
# What no free-text value may hold: a shell's quotes, expansions, separators; JSON's quote and escape.
HOSTILE = ["'", '"', "$", "`", ";", "&", "|", " ", "\n", "\\", "<", ">", "(", "*"]


def accepts(param, value):
    """Whether CloudFormation takes `value` for the parameter (AllowedPattern matches the whole
    value; for a list, each item; AllowedValues lists it)."""
    if "AllowedValues" in param:
        return value in param["AllowedValues"]
    items = value.split(",") if param["Type"] == "CommaDelimitedList" else [value]
    return all(re.fullmatch(param["AllowedPattern"], item) for item in items)


class Patterns(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.template = cfn.load_template()
        cls.params = cls.template["Parameters"]

    def free_text(self):
        return [n for n, p in self.params.items() if p["Type"] in ("String", "CommaDelimitedList") and "AllowedValues" not in p]

    def test_every_free_text_parameter_has_a_pattern_and_a_table(self):
        self.assertEqual(sorted(n for n in self.free_text() if "AllowedPattern" not in self.params[n]), [])
        self.assertEqual(sorted(self.free_text()), sorted(MALFORMED))

    def test_malformed_values_are_refused(self):
        for name, values in MALFORMED.items():
            for value in values:
                with self.subTest(name=name, value=value):
                    self.assertFalse(accepts(self.params[name], value))

    def test_no_hostile_character_gets_through(self):
        for name in self.free_text():
            good = GOOD[name]
            self.assertTrue(accepts(self.params[name], good), f"{name} refuses {good!r}")
            for c in HOSTILE:
                for value in (good + c, c + good, good[:3] + c + good[3:]):
                    with self.subTest(name=name, value=value):
                        self.assertFalse(accepts(self.params[name], value))

    def test_defaults_are_accepted(self):
        for name in self.free_text():
            default = self.params[name].get("Default")
            if default:
                self.assertTrue(accepts(self.params[name], default), name)

    def test_choices_and_numbers_are_bounded(self):
        for name, p in self.params.items():
            if p["Type"] == "Number":
                self.assertIn("MinValue", p, name)
            elif "AllowedValues" in p:
                self.assertIn(p["Default"], p["AllowedValues"], name)

    def test_rules_refuse_subnets_without_their_vpc_and_the_reverse_and_efa_over_zones(self):
        rules = self.template["Rules"]

        def refused(**params):
            r = cfn.Resolved(self.template, **params)
            return [name for name, rule in rules.items()
                    if r.value(rule.get("RuleCondition", True)) and not all(r.value(a["Assert"]) for a in rule["Assertions"])]
        self.assertEqual(refused(), [])
        self.assertEqual(refused(VpcId="vpc-0a", PublicSubnetId="subnet-0a", PrivateSubnetId="subnet-0b"), [])
        self.assertEqual(refused(VpcId="vpc-0a", PublicSubnetId="subnet-0a"), ["ExistingVpcNeedsBothSubnets"])
        self.assertEqual(refused(VpcId="vpc-0a"), ["ExistingVpcNeedsBothSubnets"])
        self.assertEqual(refused(PrivateSubnetId="subnet-0b"), ["NewVpcTakesNoSubnets"])
        self.assertEqual(refused(VpcId="vpc-0a", PublicSubnetId="subnet-0a", PrivateSubnetId="subnet-0b,subnet-0c,subnet-0d"), [])
        self.assertEqual(refused(PrivateSubnetId="subnet-0b,subnet-0c"), ["NewVpcTakesNoSubnets"])
        # EFA: one cluster placement group, one zone
        self.assertEqual(refused(UseEfa="true"), ["EfaNodesShareOneZone"])
        self.assertEqual(refused(UseEfa="true", ComputeZones="3"), ["EfaNodesShareOneZone"])
        self.assertEqual(refused(UseEfa="true", ComputeZones="1"), [])
        self.assertEqual(refused(UseEfa="true", VpcId="vpc-0a", PublicSubnetId="subnet-0a",
                                 PrivateSubnetId="subnet-0b,subnet-0c"), [])  # (the first subnet is used)


def shell_scripts(template):
    """(where, text, variables) of every shell script the template substitutes values into."""
    res = template["Resources"]
    found = []
    for lt in ("ComputeLaunchTemplate", "ComputeOnDemandLaunchTemplate"):
        found.append((f"{lt} user data", res[lt]["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]["Fn::Sub"]))
    found.append(("HeadNode user data", res["HeadNode"]["Properties"]["UserData"]["Fn::Base64"]["Fn::Sub"]))
    init = res["HeadNode"]["Metadata"]["AWS::CloudFormation::Init"]
    found += [(f"cfn-init command {n}", c["command"]["Fn::Sub"]) for key, config in init.items() if key != "configSets"
              for n, c in config.get("commands", {}).items() if isinstance(c["command"], dict)]
    files = init["settings"]["files"]
    found.append(("cluster.env (sourced by root)", files["/etc/hpctrain/cluster.env"]["content"]["Fn::Sub"]))
    found.append(("cfn-hup's hook (its action run by root)", files["/etc/cfn/hooks.d/hpctrain-settings.conf"]["content"]["Fn::Sub"]))
    out = []
    for where, sub in found:
        text, variables = (sub, {}) if isinstance(sub, str) else sub
        out.append((where, text, variables))
    return out


class Quoting(unittest.TestCase):
    def test_every_substituted_value_is_single_quoted(self):
        template = cfn.load_template()
        scripts = shell_scripts(template)
        self.assertEqual(len(scripts), 6)
        for where, text, variables in scripts:
            for line in text.splitlines():
                for m in re.finditer(r"\$\{([^}!][^}]*)\}", line):
                    name = m.group(1)
                    if "Fn::FindInMap" in variables.get(name, {}):
                        continue  # a constant of the template (the boot script), not a value
                    with self.subTest(where=where, line=line):
                        before = line[:m.start()]
                        self.assertEqual(before.count("'") % 2, 1, f"${{{name}}} is not inside single quotes")
                        self.assertTrue(line[m.end():].startswith("'"), f"${{{name}}} is not the whole quoted word")

    def test_the_check_catches_an_unquoted_value(self):
        """The check above, on a script with a value planted unquoted."""
        line = "git clone ${HpctrainRepository} /opt/x"
        m = re.search(r"\$\{([^}!][^}]*)\}", line)
        self.assertNotEqual(line[:m.start()].count("'") % 2, 1)


class BootInstall(unittest.TestCase):
    """The template's boot script (Mappings: Boot/Install), run with /opt/hpctrain/src moved into
    a temporary directory, against a local repository."""

    @classmethod
    def setUpClass(cls):
        cls.script = cfn.load_template()["Mappings"]["Boot"]["Install"]["Script"]

    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.tmp)
        self.repo = os.path.join(self.tmp, "repo")
        env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")

        def git(*args):
            return subprocess.run(["git", "-C", self.repo, *args], check=True, capture_output=True, text=True, env=env).stdout.strip()
        os.makedirs(self.repo)
        git("init", "-q", "-b", "main")
        for name in ("released", "later"):
            with open(os.path.join(self.repo, "VERSION"), "w", encoding="utf-8") as f:
                f.write(name + "\n")
            git("add", "VERSION")
            git("commit", "-q", "-m", name)
            setattr(self, name, git("rev-parse", "HEAD"))
        git("tag", "v1.0.0", self.released)
        git("branch", "v2.0.0", self.later)  # a branch named like a tag: never taken for one
        self.dest = os.path.join(self.tmp, "opt", "hpctrain", "src")

    def install(self, revision):
        script = self.script.replace("/opt/hpctrain/src", self.dest)
        return subprocess.run(["sh", "-c", f"set -eu; REPOSITORY='{self.repo}'; REVISION='{revision}'; {script}"],
                              capture_output=True, text=True, check=False)

    def installed(self):
        with open(os.path.join(self.dest, "VERSION"), encoding="utf-8") as f:
            return f.read().strip()

    def test_a_commit_id(self):
        r = self.install(self.released)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(self.installed(), "released")
        for root, dirs, files in os.walk(self.dest):
            for name in dirs + files:
                st = os.lstat(os.path.join(root, name))
                self.assertEqual((st.st_uid, st.st_mode & 0o022), (0, 0), os.path.join(root, name))

    def test_a_tag(self):
        r = self.install("v1.0.0")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(self.installed(), "released")

    def test_a_branch_is_not_a_tag(self):
        self.assertNotEqual(self.install("v2.0.0").returncode, 0)

    def test_a_commit_the_repository_lacks(self):
        self.assertNotEqual(self.install("0123456789abcdef0123456789abcdef01234567").returncode, 0)

    def test_a_revision_that_is_not_what_was_fetched_fails_the_boot(self):
        """A branch name ("main") fetches, but is not the commit that was asked for. The compute
        user data's ERR trap, which shuts the instance down, must see it: an `exit` would end
        the script without it, and the instance would bill until Slurm's ResumeTimeout."""
        script = self.script.replace("/opt/hpctrain/src", self.dest)
        r = subprocess.run(["bash", "-c", f"set -eu; trap 'echo boot failed' ERR; REPOSITORY='{self.repo}'; "
                                          f"REVISION='main'; {script}"], capture_output=True, text=True, check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("fetched " + self.later + ", not main", r.stderr)
        self.assertEqual(r.stdout, "boot failed\n")


if __name__ == "__main__":
    unittest.main()

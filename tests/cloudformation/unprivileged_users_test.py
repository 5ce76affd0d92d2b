"""No root for jobs on a compute node (cloudformation/node/unprivileged_users.sh), offline: the script
runs into a scratch root laid out as the Deep Learning AMI's first boot leaves it (cloud-init's
default user ubuntu, uid 1000 like the head node's admin, with passwordless sudo in
/etc/sudoers.d/90-cloud-init-users and in the adm, sudo, lxd and docker groups), as join_compute.sh
runs it at every power-up:

- every account of a regular uid (login.defs' UID_MIN to UID_MAX) leaves the groups that give root
  or the system's logs, in /etc/group and /etc/gshadow, and nothing else changes (other groups,
  system accounts);
- a sudoers rule denies them everything, in a file that sudo reads after every other one there (the
  last rule that matches decides), owned by root and 0440;
- run again, it changes nothing; bad arguments are one line and exit 2;
- join_compute.sh runs it before slurmd starts.

sudo's own verdict (`sudo -n` as uid 1000, with these files in a mount namespace) is not asked here:
this machine's packages have no sudo. Needs root (gpasswd --root chroots) and gpasswd; skips (77)
without them. CI runs as root with them."""

import os
import re
import shutil
import stat
import subprocess
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
NODE_DIR = os.path.normpath(os.path.join(HERE, "..", "..", "cloudformation", "node"))
SCRIPT = os.path.join(NODE_DIR, "unprivileged_users.sh")
RULE = "etc/sudoers.d/zz-hpctrain-no-sudo-for-users"

# The image as cloud-init leaves it at a first boot (Ubuntu 22.04's default user and groups), with
# a second regular account and a system account in docker's group.
IMAGE = {
    "etc/passwd": """\
root:x:0:0:root:/root:/bin/bash
daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin
syslog:x:104:110::/home/syslog:/usr/sbin/nologin
helper:x:998:998::/nonexistent:/usr/sbin/nologin
ubuntu:x:1000:1000:Ubuntu:/home/ubuntu:/bin/bash
alice:x:1001:1001::/home/alice:/bin/bash
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
""",
    "etc/group": """\
root:x:0:
adm:x:4:syslog,ubuntu
dip:x:30:ubuntu
sudo:x:27:ubuntu
video:x:44:ubuntu
lxd:x:110:ubuntu
helper:x:998:
docker:x:999:helper,ubuntu,alice
ubuntu:x:1000:
alice:x:1001:
nogroup:x:65534:
""",
    "etc/gshadow": """\
root:*::
adm:*::syslog,ubuntu
dip:*::ubuntu
sudo:*::ubuntu
video:*::ubuntu
lxd:!::ubuntu
helper:!::
docker:!::helper,ubuntu,alice
ubuntu:!::
alice:!::
nogroup:*::
""",
    "etc/login.defs": "UID_MIN\t\t\t 1000\nUID_MAX\t\t\t60000\n",
    "etc/sudoers": "root ALL=(ALL:ALL) ALL\n%admin ALL=(ALL) ALL\n%sudo ALL=(ALL:ALL) ALL\n"
                   "@includedir /etc/sudoers.d\n",
    "etc/sudoers.d/README": "# Files in this directory are read in lexical order; those with a '.' are skipped.\n",
    "etc/sudoers.d/90-cloud-init-users": "# Created by cloud-init\n\n# User rules for ubuntu\n"
                                         "ubuntu ALL=(ALL) NOPASSWD:ALL\n",
}
PRIVILEGED = {"adm", "admin", "disk", "docker", "lxd", "sudo", "wheel"}


def members(root, path):
    """{group: [members]} of /etc/group or /etc/gshadow (the fourth field of both)."""
    with open(os.path.join(root, path), encoding="utf-8") as f:
        rows = [line.rstrip("\n").split(":") for line in f]
    return {fields[0]: [m for m in fields[3].split(",") if m] for fields in rows}


def sudo_reads(root):
    """The files of /etc/sudoers.d that sudo reads, in its order: lexical, skipping names with a
    dot or ending in '~' (sudoers(5), @includedir)."""
    d = os.path.join(root, "etc/sudoers.d")
    return sorted(n for n in os.listdir(d) if "." not in n and not n.endswith("~"))


class Script(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0:
            raise unittest.SkipTest("not root: gpasswd --root chroots into the scratch root")
        if shutil.which("gpasswd") is None:
            raise unittest.SkipTest("no gpasswd (the passwd package)")

    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="hpctrain-users-")
        self.addCleanup(shutil.rmtree, self.root, ignore_errors=True)
        for path, text in IMAGE.items():
            os.makedirs(os.path.dirname(os.path.join(self.root, path)), exist_ok=True)
            with open(os.path.join(self.root, path), "w", encoding="utf-8") as f:
                f.write(text)

    def run_script(self, *args):
        return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, timeout=60, check=False)

    def test_the_accounts_jobs_run_as_get_no_root(self):
        r = self.run_script("--root", self.root)
        self.assertEqual((r.returncode, r.stderr), (0, ""))
        self.assertEqual(sorted(r.stdout.splitlines()[:-1]),
                         sorted(f"unprivileged_users.sh: {u} is no longer in {g}"
                                for u, g in (("ubuntu", "adm"), ("ubuntu", "sudo"), ("ubuntu", "lxd"),
                                             ("ubuntu", "docker"), ("alice", "docker"))))
        for path in ("etc/group", "etc/gshadow"):
            with self.subTest(path=path):
                groups = members(self.root, path)
                for group, who in groups.items():
                    if group in PRIVILEGED:
                        self.assertFalse({"ubuntu", "alice"} & set(who), f"{path}: {group} still has {who}")
                # the others' memberships, and the other groups', as they were
                self.assertEqual(groups["adm"], ["syslog"])
                self.assertEqual(groups["docker"], ["helper"])
                self.assertEqual((groups["video"], groups["dip"]), (["ubuntu"], ["ubuntu"]))
        with open(os.path.join(self.root, "etc/passwd"), encoding="utf-8") as f:
            self.assertEqual(f.read(), IMAGE["etc/passwd"])

        # The rule: read last, root's, not writable, one line per regular uid (1000 and 1001 only).
        info = os.stat(os.path.join(self.root, RULE))
        self.assertEqual((stat.S_IMODE(info.st_mode), info.st_uid), (0o440, 0))
        self.assertEqual(sudo_reads(self.root)[-1], os.path.basename(RULE))
        with open(os.path.join(self.root, RULE), encoding="utf-8") as f:
            rules = [line for line in f.read().splitlines() if not re.match(r"#\D|$", line)]
        self.assertEqual(rules, ["#1000 ALL=(ALL:ALL) !ALL  # ubuntu", "#1001 ALL=(ALL:ALL) !ALL  # alice"])
        self.assertEqual(os.listdir(os.path.join(self.root, "etc/sudoers.d")).count(os.path.basename(RULE) + ".new"), 0)

        # Again (a reboot, the image made from such a node): nothing more to do, the same result.
        with open(os.path.join(self.root, "etc/group"), encoding="utf-8") as f:
            before = f.read()
        r = self.run_script("--root", self.root)
        self.assertEqual((r.returncode, r.stderr), (0, ""))
        self.assertEqual(r.stdout, "unprivileged_users.sh: no sudo for 2 account(s) of uids 1000 to 60000 "
                                   "(/etc/sudoers.d/zz-hpctrain-no-sudo-for-users)\n")
        with open(os.path.join(self.root, "etc/group"), encoding="utf-8") as f:
            self.assertEqual(f.read(), before)

    def test_an_account_whose_own_group_gives_root_fails_the_boot(self):
        with open(os.path.join(self.root, "etc/passwd"), "a", encoding="utf-8") as f:
            f.write("builder:x:1002:999::/home/builder:/bin/bash\n")  # its primary group: docker
        r = self.run_script("--root", self.root)
        self.assertEqual((r.returncode, r.stderr), (1, "unprivileged_users.sh: error: builder's own group is docker\n"))

    def test_bad_arguments_are_one_line_and_exit_2(self):
        empty = tempfile.mkdtemp(prefix="hpctrain-users-empty-")
        self.addCleanup(shutil.rmtree, empty, ignore_errors=True)
        for args, message in ((["bogus"], "unknown argument 'bogus' (usage: unprivileged_users.sh [--root DIR])"),
                              (["--root"], "--root needs a directory"),
                              (["--root", empty], f"no {empty}/etc/passwd and {empty}/etc/group to read")):
            with self.subTest(args=args):
                r = self.run_script(*args)
                self.assertEqual((r.returncode, r.stdout), (2, ""))
                self.assertEqual(r.stderr, f"unprivileged_users.sh: error: {message}\n")
        self.assertEqual(os.listdir(empty), [], "a refused call wrote files")


class JoinCompute(unittest.TestCase):
    def test_run_before_slurmd(self):
        """At every power-up, right after the metadata firewall and before slurmd can run a job."""
        with open(os.path.join(NODE_DIR, "join_compute.sh"), encoding="utf-8") as f:
            lines = [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]
        call = 'bash "$node_dir/unprivileged_users.sh"'
        self.assertTrue(call in lines, f"join_compute.sh does not run {call}")
        self.assertEqual(lines.index(call), lines.index('bash "$node_dir/imds_firewall.sh" compute') + 1)
        self.assertLess(lines.index(call), lines.index("systemctl enable slurmd && systemctl restart slurmd"))


if __name__ == "__main__":
    unittest.main()

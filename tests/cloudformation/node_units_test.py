"""The systemd units the bootstraps write (join_compute.sh, bootstrap_head.sh), offline: each unit
is taken from its script's here-document and rendered by bash with a node's values, then read
for the settings that keep the cluster's daemons alive and bounded, and given to
`systemd-analyze verify` where it is installed (skipped without; CI has it). And the compute
node's slurmd waits for /shared on every boot: its drop-in is installed, and in systemd's boot
transaction slurmd starts only after /shared's mount."""

import os
import re
import shutil
import subprocess
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
NODE_DIR = os.path.normpath(os.path.join(HERE, "..", "..", "cloudformation", "node"))
# What the scripts' here-documents expand: a node's values.
VALUES = {"node_dir": NODE_DIR, "node": "gpu-1", "slurm_conf": "/var/spool/slurmd/conf-cache/slurm.conf",
          "HEARTBEAT_MINUTES": "15"}


def units(script):
    """{unit file name: text} of each `cat > /etc/systemd/system/NAME << UNIT` in `script`,
    expanded by bash as the script expands it."""
    with open(os.path.join(NODE_DIR, script), encoding="utf-8") as f:
        text = f.read()
    found = {}
    for m in re.finditer(r"^cat > /etc/systemd/system/(\S+) << ('?)UNIT\2\n(.*?\n)UNIT$", text, re.M | re.S):
        name, quoted, body = m.groups()
        r = subprocess.run(["bash", "-c", f"cat << {quoted}UNIT{quoted}\n{body}UNIT\n"], capture_output=True, text=True,
                           env=dict(os.environ, **VALUES), check=True)
        found[name] = r.stdout
    return found


def settings(unit):
    """{(section, key): value} of a unit's text."""
    found, section = {}, None
    for line in unit.splitlines():
        if line.startswith("["):
            section = line.strip("[]")
        elif "=" in line:
            key, value = line.split("=", 1)
            found[section, key] = value
    return found


class ComputeUnits(unittest.TestCase):
    def setUp(self):
        self.units = units("join_compute.sh")

    def test_the_daemons_restart_for_the_instances_life(self):
        """The spot watcher and the watchdog: restarted after any failure, a pause between tries,
        and no start limit (systemd's default stops restarting for good after 5 starts in 10 s:
        a node without its watchdog bills on once the head is gone)."""
        for name in ("hpctrain-spot-watcher.service", "hpctrain-computemgtd.service"):
            with self.subTest(name):
                unit = settings(self.units[name])
                self.assertEqual(unit.get(("Service", "Restart")), "always")
                self.assertGreaterEqual(float(unit.get(("Service", "RestartSec"), 0)), 1)
                self.assertEqual(unit.get(("Unit", "StartLimitIntervalSec")), "0")


class SlurmdWaitsForShared(unittest.TestCase):
    DROP_IN = os.path.join(NODE_DIR, "systemd", "slurmd-shared.conf")

    def test_join_compute_installs_the_drop_in(self):
        with open(os.path.join(NODE_DIR, "join_compute.sh"), encoding="utf-8") as f:
            script = f.read()
        installs = re.search(r'(?m)^install -m 0644 "\$node_dir/systemd/slurmd-shared.conf" '
                             r"/etc/systemd/system/slurmd\.service\.d/\S+\.conf$", script)
        self.assertTrue(installs, "join_compute.sh does not install systemd/slurmd-shared.conf as slurmd's drop-in")
        with open(self.DROP_IN, encoding="utf-8") as f:
            self.assertEqual(settings(f.read()).get(("Unit", "RequiresMountsFor")), "/shared")

    def test_slurmd_starts_after_the_mount(self):
        """A probe ordered after slurmd and before shared.mount (a stand-in for the one fstab's
        line makes) closes an ordering cycle exactly when slurmd requires and follows the mount."""
        if shutil.which("systemd-analyze") is None:
            self.skipTest("systemd-analyze not found (the systemd package)")
        vendor = next((d for d in ("/lib/systemd/system", "/usr/lib/systemd/system")
                       if os.path.exists(os.path.join(d, "sysinit.target"))), None)
        if vendor is None:
            self.skipTest("no systemd unit directory with sysinit.target")
        standins = {"slurmd.service": "[Unit]\nDescription=stand-in for Slurm's slurmd\n[Service]\nExecStart=/bin/true\n",
                    "shared.mount": "[Mount]\nWhat=fs-0:/\nWhere=/shared\nType=nfs4\nOptions=_netdev\n",
                    "probe.service": "[Unit]\nDefaultDependencies=no\nWants=slurmd.service\nAfter=slurmd.service\n"
                                     "Before=shared.mount\n[Service]\nType=oneshot\nExecStart=/bin/true\n"}
        for drop_in in (True, False):
            with self.subTest(drop_in=drop_in), tempfile.TemporaryDirectory() as d:
                for name, text in standins.items():
                    with open(os.path.join(d, name), "w", encoding="utf-8") as f:
                        f.write(text)
                if drop_in:
                    os.mkdir(os.path.join(d, "slurmd.service.d"))
                    shutil.copy(self.DROP_IN, os.path.join(d, "slurmd.service.d", "shared.conf"))
                r = subprocess.run(["systemd-analyze", "verify", "--man=no", "probe.service"], capture_output=True,
                                   text=True, env=dict(os.environ, SYSTEMD_UNIT_PATH=f"{d}:{vendor}"), check=False)
                out = r.stdout + r.stderr
                self.assertEqual("ordering cycle" in out and "shared.mount" in out, drop_in, out)


class HeadUnits(unittest.TestCase):
    def test_a_pass_of_the_cluster_manager_is_bounded(self):
        """A pass holds the state file's lock that resume.py waits for: a hung one is killed."""
        unit = settings(units("bootstrap_head.sh")["hpctrain-clustermgtd.service"])
        limit = unit.get(("Service", "TimeoutStartSec"), "infinity")
        m = re.fullmatch(r"(\d+)(min|s)?", limit)
        self.assertTrue(m, f"TimeoutStartSec={limit}")
        self.assertLessEqual(int(m[1]) * (60 if m[2] == "min" else 1), 600)
        self.assertGreater(int(m[1]), 0)

    def test_the_power_log_is_slurms_before_any_program_writes_it(self):
        """launch_check.py runs as root (bootstrap's last step, each update), resume.py, suspend.py
        and the cluster manager as Slurm's user: a power log root made first was theirs to open no
        more, and their lines reached no log group. bootstrap_head.sh makes the cluster's log_file
        Slurm's user's before the settings, the cluster manager's timer and launch_check.py. (Planted:
        the line moved after launch_check.py.)"""
        with open(os.path.join(NODE_DIR, "bootstrap_head.sh"), encoding="utf-8") as f:
            text = f.read()
        with open(os.path.join(NODE_DIR, "..", "cluster.yaml"), encoding="utf-8") as f:
            log = re.search(r'"log_file": "([^"]+)"', f.read())[1]
        made = re.search(r"install -o slurm -g slurm -m 0644 /dev/null (\S+)\n", text)
        self.assertTrue(made, "bootstrap_head.sh makes no power log as Slurm's user")
        self.assertEqual(made[1], log)
        for later in ('"$node_dir/apply_head_settings.sh"', "systemctl enable --now hpctrain-clustermgtd.timer",
                      'python3 "$node_dir/launch_check.py"'):
            self.assertLess(made.start(), text.index(later), later)


class Verify(unittest.TestCase):
    """systemd-analyze verify on each rendered unit."""

    def test_units_verify(self):
        if shutil.which("systemd-analyze") is None:
            self.skipTest("systemd-analyze not found (the systemd package)")
        for script in ("join_compute.sh", "bootstrap_head.sh"):
            for name, text in units(script).items():
                with self.subTest(script=script, unit=name), tempfile.TemporaryDirectory() as d:
                    path = os.path.join(d, name)
                    with open(path, "w", encoding="utf-8") as f:
                        f.write(text)
                    r = subprocess.run(["systemd-analyze", "verify", "--man=no", path], capture_output=True,
                                       text=True, check=False)
                    out = "\n".join(line for line in (r.stdout + r.stderr).splitlines() if name in line)
                    self.assertEqual(out, "", r.stdout + r.stderr)


if __name__ == "__main__":
    unittest.main()

"""The systemd units the bootstraps write (join_compute.sh, bootstrap_head.sh), offline: each unit
is taken from its script's here-document and rendered by bash with a node's values, then read
for the settings that keep the cluster's daemons alive and bounded, and given to
`systemd-analyze verify` where it is installed (skipped without; CI has it)."""

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


class HeadUnits(unittest.TestCase):
    def test_a_pass_of_the_cluster_manager_is_bounded(self):
        """A pass holds the state file's lock that resume.py waits for: a hung one is killed."""
        unit = settings(units("bootstrap_head.sh")["hpctrain-clustermgtd.service"])
        limit = unit.get(("Service", "TimeoutStartSec"), "infinity")
        m = re.fullmatch(r"(\d+)(min|s)?", limit)
        self.assertTrue(m, f"TimeoutStartSec={limit}")
        self.assertLessEqual(int(m[1]) * (60 if m[2] == "min" else 1), 600)
        self.assertGreater(int(m[1]), 0)


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

"""The head node's settings applied to a real slurmctld (cloudformation/node/apply_head_settings.sh, as
cfn-hup runs it after a stack update), offline: the script renders slurm.conf from a cluster.env as
cfn-init writes it and restarts slurmctld through a stand-in `systemctl`, which starts Debian's
slurmctld as the packaged unit does (`slurmctld -D`, Type=simple: the restart returns at once,
whether slurmctld lives or dies), beside a munged of the test's own, on a free port.

- A stack update that changes ClusterName: slurmctld 22.05 keeps the name in its state and dies at
  start under another ("CLUSTER NAME MISMATCH"). The script keeps the state's name, applies the
  other settings (a new MaxComputeNodes), says so in one line and exits 1; slurmctld answers.
- slurmctld that does not come up after the restart (its port held by another program): the script
  says so in one line and exits 1 within its --wait, instead of "configuration applied".

Needs root (slurmctld runs as Slurm's user, munged as root here), slurmctld, scontrol and munged
(Debian's slurm-wlm and munge); skips (77) without them. CI runs as root with them."""

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import textwrap
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
NODE_DIR = os.path.normpath(os.path.join(HERE, "..", "..", "cloudformation", "node"))
APPLY = os.path.join(NODE_DIR, "apply_head_settings.sh")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cluster_env(name, max_nodes):
    """/etc/hpctrain/cluster.env as cfn-init writes it (cluster.yaml), with the values the script reads."""
    values = {"CLUSTER_NAME": name, "MAX_NODES": max_nodes, "CPUS": 4, "GPUS": 0, "MEMORY_MIB": 2000,
              "SUSPEND_MINUTES": 10, "RESUME_TIMEOUT": 1800}
    return "".join(f"{k}='{v}'\n" for k, v in values.items())


class RealSlurmctld(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0:
            raise unittest.SkipTest("not root: slurmctld runs as Slurm's user, munged as root")
        missing = [c for c in ("slurmctld", "scontrol", "munged", "sinfo") if shutil.which(c) is None]
        if missing:
            raise unittest.SkipTest(f"{', '.join(missing)} not found (Debian's slurm-wlm and munge)")
        try:
            pwd.getpwnam("slurm")
        except KeyError:
            raise unittest.SkipTest("no user slurm (Debian's slurm-wlm makes it)") from None

    def setUp(self):
        # (munged insists that every directory above its socket be searchable by all)
        self.dir = tempfile.mkdtemp(prefix="hpctrain-head-settings-")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        os.chmod(self.dir, 0o755)
        d = self.dir
        for sub in ("munge", "state", "log", "slurm", "bin"):
            os.makedirs(os.path.join(d, sub))
        os.chmod(os.path.join(d, "munge"), 0o755)
        for sub in ("state", "log"):
            shutil.chown(os.path.join(d, sub), "slurm", "slurm")
        with open(os.path.join(d, "munge", "munge.key"), "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(os.path.join(d, "munge", "munge.key"), 0o600)
        self.socket = os.path.join(d, "munge", "munge.socket")
        subprocess.run(["munged", f"--key-file={d}/munge/munge.key", f"--socket={self.socket}",
                        f"--pid-file={d}/munge/munged.pid", f"--log-file={d}/munge/munged.log",
                        f"--seed-file={d}/munge/munged.seed"], check=True, capture_output=True)
        self.addCleanup(self.stop, f"{d}/munge/munged.pid")
        self.addCleanup(self.stop, f"{d}/slurmctld.pid")
        self.port = free_port()
        # systemctl as the head node's: "restart slurmctld" stops the one running and starts Debian's
        # unit's command (slurmctld -D) in the background, returning at once as a Type=simple unit's
        # restart does. Before that, what this machine is not (the head node's name, slurmctld's port
        # 6817, munged's own socket) is put into the rendered slurm.conf.
        systemctl = os.path.join(d, "bin", "systemctl")
        with open(systemctl, "w", encoding="utf-8") as f:
            f.write(textwrap.dedent(f"""\
                #!/bin/bash
                echo "$*" >> {d}/systemctl.log
                [[ "$*" == "restart slurmctld" ]] || exit 0
                if [[ -f {d}/slurmctld.pid ]]; then
                  pid=$(cat {d}/slurmctld.pid)
                  kill "$pid" 2> /dev/null
                  while kill -0 "$pid" 2> /dev/null; do sleep 0.1; done
                fi
                sed -i -e 's/^SlurmctldHost=.*/SlurmctldHost=localhost(127.0.0.1)/' \\
                  -e 's/^SlurmctldPort=.*/SlurmctldPort={self.port}/' \\
                  -e 's|^SlurmctldLogFile=.*|SlurmctldLogFile={d}/log/slurmctld.log|' \\
                  -e 's|^AuthType=auth/munge$|AuthType=auth/munge\\nAuthInfo=socket={self.socket}|' \\
                  {d}/slurm/slurm.conf
                setsid slurmctld -D -f {d}/slurm/slurm.conf < /dev/null >> {d}/log/slurmctld.out 2>&1 &
                echo $! > {d}/slurmctld.pid
                """))
        os.chmod(systemctl, 0o755)
        self.env = {**os.environ, "PATH": f"{d}/bin:{os.environ['PATH']}", "SLURM_CONF": f"{d}/slurm/slurm.conf"}

    @staticmethod
    def stop(pid_file):
        try:
            with open(pid_file, encoding="utf-8") as f:
                pid = int(f.read())
            os.kill(pid, 15)
        except (OSError, ValueError):
            return
        for _ in range(100):
            try:
                os.kill(pid, 0)
            except OSError:
                return
            time.sleep(0.1)

    def apply(self, name, max_nodes, wait=30):
        with open(os.path.join(self.dir, "cluster.env"), "w", encoding="utf-8") as f:
            f.write(cluster_env(name, max_nodes))
        return subprocess.run([APPLY, "--env", os.path.join(self.dir, "cluster.env"), "--out",
                               os.path.join(self.dir, "slurm"), "--state-dir", os.path.join(self.dir, "state"),
                               "--wait", str(wait)], capture_output=True, text=True, env=self.env, timeout=wait + 60,
                              check=False)

    def slurm(self, *command):
        return subprocess.run(command, capture_output=True, text=True, env=self.env, timeout=30, check=False).stdout

    def up(self, seconds=30):
        """Whether slurmctld answers (scontrol ping) within `seconds`."""
        deadline = time.monotonic() + seconds
        while " is UP" not in self.slurm("scontrol", "ping"):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.5)
        return True

    def log(self):
        """slurmctld's log ('' before it writes one)."""
        try:
            with open(os.path.join(self.dir, "log", "slurmctld.log"), encoding="utf-8", errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def test_a_new_cluster_name_leaves_slurmctld_running(self):
        r = self.apply("hpctrain", 2)
        self.assertEqual(r.returncode, 0, r.stderr + self.log()[-2000:])
        self.assertTrue(self.up(), self.log()[-2000:])
        with open(os.path.join(self.dir, "state", "clustername"), encoding="utf-8") as f:
            self.assertEqual(f.read().strip(), "hpctrain")  # slurmctld's own record of its name

        # The update: ClusterName and MaxComputeNodes changed.
        r = self.apply("renamed", 3)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertEqual(r.stdout, "")
        self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)
        self.assertRegex(r.stderr, r"^apply_head_settings.sh: error: ClusterName 'renamed' refused: slurmctld's state "
                                   r".* is cluster 'hpctrain', fixed at creation .* give ClusterName 'hpctrain' back")
        self.assertTrue(self.up(), self.log()[-2000:])
        self.assertNotIn("CLUSTER NAME MISMATCH", self.log())
        self.assertRegex(self.slurm("scontrol", "show", "config"), r"\nClusterName\s+= hpctrain\n")
        # the other settings applied: a third node
        self.assertEqual(self.slurm("sinfo", "-h", "-N", "-o", "%N").split(), ["gpu-1", "gpu-2", "gpu-3"])
        with open(os.path.join(self.dir, "systemctl.log"), encoding="utf-8") as f:
            self.assertEqual(f.read(), "enable slurmctld\nrestart slurmctld\n" * 2)

        # Given its name back, the stack's next update applies cleanly.
        r = self.apply("hpctrain", 3)
        self.assertEqual((r.returncode, r.stderr), (0, ""))
        self.assertTrue(self.up(), self.log()[-2000:])

    def test_a_slurmctld_that_does_not_come_up_fails_the_script(self):
        """Its port held by another program (a listener that answers nothing): slurmctld does not
        serve, the restart succeeded all the same, and the script fails within its --wait."""
        with socket.socket() as held:
            held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            held.bind(("0.0.0.0", self.port))
            held.listen(16)
            start = time.monotonic()
            r = self.apply("hpctrain", 2, wait=5)
            spent = time.monotonic() - start
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertEqual(r.stdout, "")
        self.assertRegex(r.stderr, r"^apply_head_settings.sh: error: slurmctld does not answer 5 s after its restart: "
                                   r"see 'journalctl -u slurmctld' and its log \(SlurmctldLogFile in .*slurm.conf\)\n$")
        self.assertLess(spent, 5 + 30)  # (each ping ends at once: the listener closes nothing, scontrol's own bound)
        with open(os.path.join(self.dir, "systemctl.log"), encoding="utf-8") as f:
            self.assertEqual(f.read(), "enable slurmctld\nrestart slurmctld\n")


if __name__ == "__main__":
    unittest.main()

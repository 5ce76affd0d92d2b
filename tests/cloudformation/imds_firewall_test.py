"""The metadata service's firewall (cloudformation/node/imds_firewall.sh and what it installs), on
both node kinds, offline. The installer runs into a scratch root, as the bootstraps run it on a node:

- Boot: `systemd-analyze verify` on the boot transaction (multi-user.target, and slurmd) with the
  installed units and stand-ins for cloud-init's: no ordering cycle and no error. A probe unit
  ordered after X and before the firewall closes a cycle exactly when the boot starts the firewall
  before X: so it is shown to run on every boot, with cloud-init or without, before cloud-init, the
  network and sysinit.target (and so before every ordinary service: slurmd, sshd, jobs). On a
  compute node slurmd requires it: without the unit, slurmd's start fails.
- Rules: the installed rules, loaded by the unit's own command (twice, as a reload does) in a
  network namespace where the metadata addresses (IPv4 and IPv6) are local and an HTTP server
  answers there: root connects, another uid is refused, and on the head form so is everyone but
  root and Slurm's user, who connects.
- Both bootstraps run the installer for their kind before anything else uses the node.

Needs systemd-analyze and systemctl (boot), and root, unshare, nft, ip and setpriv (rules); skips
(77) without them. CI runs as root with them (setup.sh installs systemd and nftables)."""

import glob
import itertools
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
NODE_DIR = os.path.normpath(os.path.join(HERE, "..", "..", "cloudformation", "node"))
INSTALLER = os.path.join(NODE_DIR, "imds_firewall.sh")
UNIT = "hpctrain-imds-firewall.service"
IMDS = {"IPv4": "169.254.169.254", "IPv6": "fd00:ec2::254"}
PATH = os.environ.get("PATH", "/usr/bin:/bin") + ":/usr/sbin:/sbin"  # nft and ip, for a user's PATH too

# cloud-init's units on Debian and Ubuntu, as far as their order goes: the local stage before the
# network and sysinit.target; the main stage after the network is up (networking.service or
# systemd-networkd-wait-online.service, both after network-pre.target) and before sysinit.target;
# both wanted by cloud-init.target, which multi-user.target wants.
CLOUD_INIT_STANDINS = {
    "cloud-init-local.service": """
        [Unit]
        DefaultDependencies=no
        Wants=network-pre.target
        Before=network-pre.target sysinit.target
        [Service]
        Type=oneshot
        ExecStart=/bin/true
        """,
    "hpctrain-test-network-online.service": """
        [Unit]
        DefaultDependencies=no
        After=network-pre.target
        [Service]
        Type=oneshot
        ExecStart=/bin/true
        """,
    "cloud-init.service": """
        [Unit]
        DefaultDependencies=no
        Wants=cloud-init-local.service hpctrain-test-network-online.service
        After=cloud-init-local.service hpctrain-test-network-online.service
        Before=sysinit.target
        [Service]
        Type=oneshot
        ExecStart=/bin/true
        """,
    "cloud-init.target": """
        [Unit]
        Wants=cloud-init-local.service cloud-init.service
        """,
}
# Where Slurm is not installed: a service with the default dependencies, as the packaged slurmd.
SLURMD_STANDIN = """
    [Unit]
    Description=stand-in for Slurm's slurmd
    [Service]
    ExecStart=/bin/true
    """


def vendor_unit_dir():
    for d in ("/lib/systemd/system", "/usr/lib/systemd/system"):
        if os.path.exists(os.path.join(d, "sysinit.target")):
            return d
    return None


def install(root, kind, users=None):
    """imds_firewall.sh into root, as the node's bootstrap runs it (plus --users)."""
    args = ["bash", INSTALLER, "--root", root] + (["--users", users] if users else []) + [kind]
    r = subprocess.run(args, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise AssertionError(f"{' '.join(args)}: exit {r.returncode}: {r.stderr}")


def head_users():
    """The head's shipped users (root, slurm) where Slurm's user exists here; else root and
    another system user given through --users. Returns (--users or None, that user's uid)."""
    try:
        return None, pwd.getpwnam("slurm").pw_uid
    except KeyError:
        return "root,daemon", pwd.getpwnam("daemon").pw_uid


class Boot(unittest.TestCase):
    """The installed units in systemd's boot transaction, as `systemd-analyze verify` builds it."""

    @classmethod
    def setUpClass(cls):
        missing = [p for p in ("systemd-analyze", "systemctl") if shutil.which(p) is None]
        if missing:
            raise unittest.SkipTest(f"{', '.join(missing)} not found (the systemd package)")
        cls.vendor = vendor_unit_dir()
        if cls.vendor is None:
            raise unittest.SkipTest("no systemd unit directory with sysinit.target")
        if not os.access("/usr/sbin/nft", os.X_OK):
            raise unittest.SkipTest("/usr/sbin/nft not found (the nftables package): verify checks ExecStart")

    def setUp(self):
        d = tempfile.TemporaryDirectory()
        self.addCleanup(d.cleanup)
        self.dir = d.name

    def node(self, kind, cloud_init=True):
        """A scratch root with the firewall installed for kind, and the stand-ins beside it (with
        or without cloud-init's)."""
        name = f"{kind}-{'with' if cloud_init else 'without'}-cloud-init"
        root = os.path.join(self.dir, name)
        install(root, kind, head_users()[0] if kind == "head" else None)
        standins = os.path.join(self.dir, f"{name}-standins")
        os.makedirs(os.path.join(standins, "multi-user.target.wants"))
        units = dict(CLOUD_INIT_STANDINS) if cloud_init else {}
        if not os.path.exists(os.path.join(self.vendor, "slurmd.service")):
            units["slurmd.service"] = SLURMD_STANDIN
        for name, text in units.items():
            with open(os.path.join(standins, name), "w", encoding="utf-8") as f:
                f.write(textwrap.dedent(text))
        if cloud_init:
            os.symlink("../cloud-init.target", os.path.join(standins, "multi-user.target.wants", "cloud-init.target"))
        return root, standins

    def verify(self, root, standins, *units):
        """systemd-analyze verify on units, found in root's /etc, the stand-ins and systemd's own."""
        path = ":".join([os.path.join(root, "etc", "systemd", "system"), standins, self.vendor])
        r = subprocess.run(["systemd-analyze", "verify", "--man=no", *units], capture_output=True, text=True,
                           env=dict(os.environ, SYSTEMD_UNIT_PATH=path), check=False)
        return r.returncode, r.stdout + r.stderr

    def precedes(self, root, standins, first, then):
        """Whether the boot starts first before then: the probe, after then and before first,
        wanting only the boot (multi-user.target and slurmd), closes an ordering cycle exactly
        when first is in the boot transaction and ordered before then."""
        with open(os.path.join(standins, "hpctrain-test-probe.service"), "w", encoding="utf-8") as f:
            f.write(f"[Unit]\nDefaultDependencies=no\nWants=multi-user.target slurmd.service\n"
                    f"After={then}\nBefore={first}\n[Service]\nType=oneshot\nExecStart=/bin/true\n")
        _, out = self.verify(root, standins, "hpctrain-test-probe.service")
        return "ordering cycle" in out

    def test_boot_has_no_ordering_cycle_and_no_error(self):
        for kind in ("head", "compute"):
            with self.subTest(kind=kind):
                root, standins = self.node(kind)
                rc, out = self.verify(root, standins, "multi-user.target", "slurmd.service")
                self.assertNotIn("cycle", out)
                self.assertEqual(rc, 0, out)
                self.assertNotRegex(out, "hpctrain|cloud-init")

    def test_started_on_every_boot_before_cloud_init_the_network_and_every_service(self):
        for kind, cloud_init in itertools.product(("head", "compute"), (True, False)):
            root, standins = self.node(kind, cloud_init)
            for then in (["cloud-init-local.service", "cloud-init.service"] if cloud_init else []) + [
                    "network-pre.target", "sysinit.target", "slurmd.service", "multi-user.target"]:
                with self.subTest(kind=kind, cloud_init=cloud_init, then=then):
                    self.assertTrue(self.precedes(root, standins, UNIT, then), f"{UNIT} not started before {then}")
            # The probe is no tautology: reversed, there is no cycle.
            self.assertFalse(self.precedes(root, standins, "sysinit.target", UNIT))

    def test_compute_slurmd_does_not_start_without_the_firewall(self):
        root, standins = self.node("compute")
        self.assertEqual(self.verify(root, standins, "slurmd.service")[0], 0)
        for path in glob.glob(os.path.join(root, "etc", "systemd", "system", "*", UNIT)) + [
                os.path.join(root, "etc", "systemd", "system", UNIT)]:
            os.remove(path)  # the unit and where it is enabled: slurmd alone must want it
        rc, out = self.verify(root, standins, "slurmd.service")
        self.assertNotEqual(rc, 0, "slurmd starts without the firewall unit")
        self.assertIn(f"{UNIT} not found", out)


def exec_start(root):
    """The installed unit's ExecStart, its paths under /etc taken into root."""
    with open(os.path.join(root, "etc", "systemd", "system", UNIT), encoding="utf-8") as f:
        command = re.search(r"^ExecStart=(.*)$", f.read(), re.M).group(1).split()
    return [os.path.join(root, a.lstrip("/")) if a.startswith("/etc/") else a for a in command]


# Run in a fresh network namespace as root: the metadata addresses on lo, the unit's command run
# twice (a boot, then a reload), an HTTP server on both addresses, and for each uid in $UIDS and
# each address one connection and request from a process of that uid; prints the rules (JSON),
# then one line "UID ADDRESS open|refused" each.
NAMESPACE = r"""
set -euo pipefail
ip link set lo up
ip addr add 169.254.169.254/32 dev lo
ip -6 addr add fd00:ec2::254/128 dev lo nodad
"$@"
"$@"
nft -j list ruleset
python3 -c '
import http.server, socket, sys, threading
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"credentials")
    def log_message(self, *a): pass
class Server6(http.server.ThreadingHTTPServer):
    address_family = socket.AF_INET6
servers = [http.server.ThreadingHTTPServer(("169.254.169.254", 80), Handler), Server6(("fd00:ec2::254", 80), Handler)]
for s in servers: threading.Thread(target=s.serve_forever, daemon=True).start()
print("ready", flush=True); threading.Event().wait()
' > "$TMP/server.out" 2>&1 < /dev/null &
server=$!
trap 'kill "$server"' EXIT
for _ in $(seq 100); do grep -q ready "$TMP/server.out" 2> /dev/null && break; sleep 0.05; done
grep -q ready "$TMP/server.out" || { echo "the stand-in metadata service did not start:"; cat "$TMP/server.out"; exit 1; }
for uid in $UIDS; do
  for address in 169.254.169.254 fd00:ec2::254; do
    # open: the service answered; refused: the connection was refused or timed out; anything
    # else (the client did not run as that uid) fails the test.
    setpriv --reuid="$uid" --regid="$uid" --clear-groups python3 -c '
import socket, sys
try:
    s = socket.create_connection((sys.argv[1], 80), timeout=3)
except (ConnectionRefusedError, TimeoutError):
    print("refused"); sys.exit()
s.sendall(b"GET /latest/meta-data/iam/security-credentials/ HTTP/1.0\r\n\r\n")
print("open" if b"credentials" in s.makefile("rb").read() else "no-answer")
' "$address" | sed "s/^/$uid $address /"
  done
done
"""


class Rules(unittest.TestCase):
    """The installed rules against a stand-in metadata service in a network namespace."""

    NOBODY = 65534

    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0:
            raise unittest.SkipTest("not root: the rules are loaded in a network namespace (unshare -n)")
        missing = [p for p in ("unshare", "nft", "ip", "setpriv") if shutil.which(p, path=PATH) is None]
        if missing:
            raise unittest.SkipTest(f"{', '.join(missing)} not found (util-linux, nftables, iproute2)")
        r = subprocess.run(["unshare", "-n", "nft", "list", "ruleset"], capture_output=True, text=True,
                           env=dict(os.environ, PATH=PATH), check=False)
        if r.returncode != 0:
            raise unittest.SkipTest(f"no nftables in a new network namespace here: {r.stderr.strip()}")

    def reach(self, kind, uids, users=None):
        """{(uid, address family): open} for a node of kind, and the rules loaded (nft's JSON)."""
        with tempfile.TemporaryDirectory() as d:
            os.chmod(d, 0o755)
            root = os.path.join(d, "root")
            install(root, kind, users)
            r = subprocess.run(["unshare", "-n", "bash", "-c", NAMESPACE, "namespace", *exec_start(root)],
                               capture_output=True, text=True, cwd="/", timeout=120, check=False,
                               env=dict(os.environ, PATH=PATH, UIDS=" ".join(map(str, uids)), TMP=d))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        lines = r.stdout.splitlines()
        family = {v: k for k, v in IMDS.items()}
        reach = {}
        for line in lines[1:]:
            uid, address, result = line.split()
            self.assertIn(result, ("open", "refused"), line)
            reach[int(uid), family[address]] = result == "open"
        self.assertEqual(len(reach), 2 * len(uids), r.stdout + r.stderr)
        return reach, json.loads(lines[0])["nftables"]

    def assertReach(self, reach, uid, expected):
        for family in IMDS:
            with self.subTest(uid=uid, family=family):
                self.assertEqual(reach[uid, family], expected,
                                 f"uid {uid} {'cannot reach' if expected else 'reaches'} the metadata service "
                                 f"over {family}")

    def test_compute_root_only(self):
        slurm_uid = head_users()[1]
        reach, rules = self.reach("compute", [0, self.NOBODY, slurm_uid])
        self.assertReach(reach, 0, True)
        self.assertReach(reach, self.NOBODY, False)
        self.assertReach(reach, slurm_uid, False)
        # Loaded twice (a boot, then a reload): still one rule per address.
        self.assertEqual(sum(1 for item in rules if "rule" in item), 2, rules)

    def test_head_root_and_slurm_only(self):
        users, slurm_uid = head_users()
        reach, _ = self.reach("head", [0, self.NOBODY, slurm_uid], users)
        self.assertReach(reach, 0, True)
        self.assertReach(reach, slurm_uid, True)
        self.assertReach(reach, self.NOBODY, False)


class Bootstraps(unittest.TestCase):
    """Each bootstrap installs its kind's firewall before it does anything else with the node
    (the tags, /shared, munge, any service): on a compute node, before slurmd can run a job."""

    # A command that reads metadata, mounts, starts services or writes their units, run as a line
    # or inside $(...), || or &&.
    FIRST_USE = re.compile(r"(^|\$\(|\|\||&&)\s*(curl|mount|systemctl|python3|\S*setup\.sh|cat >)\b")

    def check(self, script, kind):
        with open(os.path.join(NODE_DIR, script), encoding="utf-8") as f:
            lines = [line for line in f.read().splitlines() if line.strip() and not line.lstrip().startswith("#")]
        call = f'bash "$node_dir/imds_firewall.sh" {kind}'
        self.assertIn(call, lines, f"{script} does not run {call}")
        uses = [i for i, line in enumerate(lines) if self.FIRST_USE.search(line)]
        self.assertLess(lines.index(call), uses[0], f"{script} uses the node before its firewall: {lines[uses[0]]}")

    def test_compute(self):
        self.check("join_compute.sh", "compute")

    def test_head(self):
        self.check("bootstrap_head.sh", "head")


class Installer(unittest.TestCase):
    def test_bad_arguments_are_one_line_and_exit_2(self):
        for args, message in ((["bogus"], "unknown argument 'bogus'"), ([], "no node kind given"),
                              (["--users", "root,no-such-user", "compute"], "no user 'no-such-user'"),
                              (["--root"], "--root needs a directory")):
            with self.subTest(args=args), tempfile.TemporaryDirectory() as d:
                r = subprocess.run(["bash", INSTALLER, "--root", d, *args], capture_output=True, text=True,
                                   check=False)
                self.assertEqual((r.returncode, r.stdout), (2, ""))
                self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)
                self.assertIn(message, r.stderr)
                self.assertEqual(os.listdir(d), [], "a refused call wrote files")


if __name__ == "__main__":
    unittest.main()

"""The spot watcher against a fake instance metadata service on loopback that, like IMDSv2,
answers reads only with a session token: no notice, nothing happens; an interruption notice
drains the node and signals its jobs' batch shells within one poll period, once; a rebalance
recommendation drains only. Slurm's commands are fakes on PATH that record their calls."""

import http.server
import os
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
WATCHER = os.path.join(HERE, "..", "..", "cloudformation", "node", "spot_watcher.py")
INTERVAL = 0.5


class FakeImds(http.server.ThreadingHTTPServer):
    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.documents = {}  # meta-data path -> body
        self.tokenless_reads = 0
        self.token_requests = 0


class Handler(http.server.BaseHTTPRequestHandler):
    TOKEN = "fake-token-123"

    def log_message(self, *args):
        pass

    def reply(self, code, body=""):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self):
        if self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
            self.server.token_requests += 1
            return self.reply(200, self.TOKEN)
        return self.reply(400)

    def do_GET(self):
        if self.headers.get("X-aws-ec2-metadata-token") != self.TOKEN:
            self.server.tokenless_reads += 1
            return self.reply(401)
        path = self.path.removeprefix("/latest/meta-data/")
        if path in self.server.documents:
            return self.reply(200, self.server.documents[path])
        return self.reply(404)


class SpotWatcher(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.log = os.path.join(self.tmp.name, "calls")
        bindir = os.path.join(self.tmp.name, "bin")
        os.mkdir(bindir)
        fakes = {"scontrol": "", "scancel": "", "squeue": 'printf "101\\n102\\n101\\n"\n'}
        for name, body in fakes.items():
            path = os.path.join(bindir, name)
            with open(path, "w", encoding="utf-8") as f:
                f.write(f'#!/bin/sh\necho "$(date +%s.%N) {name} $*" >> {self.log}\n{body}')
            os.chmod(path, 0o755)
        self.imds = FakeImds()
        threading.Thread(target=self.imds.serve_forever, daemon=True).start()
        self.addCleanup(self.imds.server_close)
        self.addCleanup(self.imds.shutdown)
        env = dict(os.environ, PATH=bindir + os.pathsep + os.environ["PATH"])
        self.proc = subprocess.Popen(
            [sys.executable, WATCHER, "--node", "gpu-1", "--interval", str(INTERVAL),
             "--imds", f"http://127.0.0.1:{self.imds.server_address[1]}"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.addCleanup(self.stop)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=5)
        self.proc.stdout.close()

    def calls(self):
        if not os.path.exists(self.log):
            return []
        with open(self.log, encoding="utf-8") as f:
            return [line.split(" ", 1) for line in f.read().splitlines()]

    def wait_for(self, what, seconds, count=1):
        """The calls containing `what`, once there are at least `count` of them."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            found = [(float(t), c) for t, c in self.calls() if what in c]
            if len(found) >= count:
                return found
            time.sleep(0.05)
        self.fail(f"no '{what}' within {seconds} s; calls: {self.calls()}")

    def test_nothing_happens_without_a_notice(self):
        time.sleep(4 * INTERVAL)
        self.assertIsNone(self.proc.poll(), "the watcher exited")
        self.assertEqual(self.calls(), [])
        self.assertGreaterEqual(self.imds.token_requests, 1)
        self.assertEqual(self.imds.tokenless_reads, 0, "a read without the IMDSv2 token")

    def test_an_interruption_drains_and_signals_within_one_poll(self):
        time.sleep(2 * INTERVAL)
        noticed = time.time()
        self.imds.documents["spot/instance-action"] = '{"action": "terminate", "time": "2026-11-22T13:00:00Z"}'
        drained = self.wait_for("scontrol update nodename=gpu-1 state=drain", 3)
        signalled = self.wait_for("scancel", 3, count=2)  # one per job: the second may lag the first
        self.assertIn("reason=hpctrain: spot interruption: terminate at 2026-11-22T13:00:00Z", drained[0][1])
        self.assertEqual(sorted(c for _, c in signalled),
                         ["scancel --signal=USR1 --batch 101", "scancel --signal=USR1 --batch 102"])
        # Within one poll period of the notice (plus the time the fakes take to start).
        self.assertLess(max(t for t, _ in signalled) - noticed, INTERVAL + 0.5)
        time.sleep(3 * INTERVAL)
        self.assertEqual(len([c for _, c in self.calls() if c.startswith("scancel")]), 2, "acted more than once")
        self.assertEqual(self.imds.tokenless_reads, 0)

    def test_a_rebalance_recommendation_drains_only(self):
        self.imds.documents["events/recommendations/rebalance"] = '{"noticeTime": "2026-11-22T12:58:00Z"}'
        self.wait_for("reason=hpctrain: spot rebalance recommendation", 3)
        time.sleep(2 * INTERVAL)
        self.assertEqual([c for _, c in self.calls() if c.startswith("scancel")], [])


if __name__ == "__main__":
    unittest.main()

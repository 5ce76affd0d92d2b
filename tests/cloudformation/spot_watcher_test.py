"""The spot watcher against a fake instance metadata service on loopback that, like IMDSv2,
answers reads only with a session token: no notice, nothing happens; an interruption notice
drains the node and signals its jobs' batch shells within one poll period, once each; what failed
(the drain, the job listing, a job's signal) is done again at the next polls, and a job listed
later is signalled too; a reply cut short does not stop the watcher; a rebalance recommendation
drains only. Slurm's commands are fakes on PATH that record their calls, and fail as often as a
test says."""

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
        self.truncated = 0  # how many of the next reads of a document end before their Content-Length
        self.polls = []  # (time.time(), served the notice) of each read of spot/instance-action


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
        if path == "spot/instance-action":
            self.server.polls.append((time.time(), path in self.server.documents))
        if path in self.server.documents:
            if self.server.truncated:
                self.server.truncated -= 1
                self.send_response(200)
                self.send_header("Content-Length", "1000")
                self.end_headers()
                self.wfile.write(b'{"action": ')
                self.close_connection = True
                return None
            return self.reply(200, self.server.documents[path])
        return self.reply(404)


class SpotWatcher(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.log = os.path.join(self.tmp.name, "calls")
        bindir = os.path.join(self.tmp.name, "bin")
        os.mkdir(bindir)
        # squeue prints squeue.out, 101 102 101 unless a test writes it.
        fakes = {"scontrol": "", "scancel": "",
                 "squeue": f'cat {self.path("squeue.out")} 2> /dev/null || printf "101\\n102\\n101\\n"\n'}
        for name, body in fakes.items():
            path = os.path.join(bindir, name)
            with open(path, "w", encoding="utf-8") as f:
                # NAME.failures (a count, written by a test): that many calls fail before the rest succeed.
                failures = self.path(f"{name}.failures")
                f.write(f'#!/bin/sh\necho "$(date +%s.%N) {name} $*" >> {self.log}\n'
                        f'n=$(cat {failures} 2> /dev/null || echo 0)\n'
                        f'if [ "$n" -gt 0 ]; then echo $((n - 1)) > {failures};'
                        f' echo "{name}: error: Socket timed out on send/recv operation" >&2; exit 1; fi\n{body}')
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
        # Each test starts once the watcher polls: its start-up beside busy loops took over 2 s, and
        # the tests' bounds were then spent before its first poll.
        self.wait_for_polls(1)

    def path(self, name):
        return os.path.join(self.tmp.name, name)

    def write(self, name, text):
        with open(self.path(name), "w", encoding="utf-8") as f:
            f.write(text)

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

    def wait_for_polls(self, count, seconds=60):
        """Until the watcher has read spot/instance-action `count` times in all (polls, not time:
        on a loaded machine a poll period may hold no poll)."""
        deadline = time.monotonic() + seconds
        while len(self.imds.polls) < count:
            self.assertIsNone(self.proc.poll(), "the watcher exited")
            self.assertLess(time.monotonic(), deadline, f"fewer than {count} polls in {seconds} s")
            time.sleep(0.02)

    def test_nothing_happens_without_a_notice(self):
        self.wait_for_polls(4)
        self.assertIsNone(self.proc.poll(), "the watcher exited")
        self.assertEqual(self.calls(), [])
        self.assertGreaterEqual(self.imds.token_requests, 1)
        self.assertEqual(self.imds.tokenless_reads, 0, "a read without the IMDSv2 token")

    def test_an_interruption_drains_and_signals_within_one_poll(self):
        self.wait_for_polls(2)
        self.imds.documents["spot/instance-action"] = '{"action": "terminate", "time": "2026-11-22T13:00:00Z"}'
        drained = self.wait_for("scontrol update nodename=gpu-1 state=drain", 30)
        signalled = self.wait_for("scancel", 30, count=2)  # one per job: the second may lag the first
        self.assertIn("reason=hpctrain: spot interruption: terminate at 2026-11-22T13:00:00Z", drained[0][1])
        self.assertEqual(sorted(c for _, c in signalled),
                         ["scancel --signal=USR1 --batch 101", "scancel --signal=USR1 --batch 102"])
        # Within the poll that first read the notice: after that read, before the next. (It was
        # within INTERVAL + 0.5 s of the notice by the clock, which beside busy loops took 2-3.5 s.)
        first = next(i for i, (_, notice) in enumerate(self.imds.polls) if notice)
        polls = len(self.imds.polls)
        self.wait_for_polls(polls + 2)
        read, after = self.imds.polls[first][0], self.imds.polls[first + 1][0]
        for t, c in drained[:1] + signalled:
            self.assertTrue(read <= t < after, f"{c} at {t}, not in the poll of {read} (next poll {after})")
        self.assertEqual(len([c for _, c in self.calls() if c.startswith("scancel")]), 2, "acted more than once")
        self.assertEqual(self.imds.tokenless_reads, 0)

    def test_a_failed_drain_or_job_listing_is_done_again_at_the_next_polls(self):
        """slurmctld too busy to answer: the first drain and the first two listings fail. The
        notice is acted on again until both worked (a failed squeue is not "no jobs"), and each job
        is signalled once; one whose scancel failed is signalled at the next poll."""
        self.write("scontrol.failures", "1")
        self.write("squeue.failures", "2")
        self.write("scancel.failures", "1")
        self.imds.documents["spot/instance-action"] = '{"action": "terminate", "time": "2026-11-22T13:00:00Z"}'
        self.wait_for("scontrol update nodename=gpu-1 state=drain", 30, count=2)
        self.wait_for("scancel", 30, count=3)  # 101 failed once, then 101 and 102
        self.wait_for_polls(len(self.imds.polls) + 3)
        calls = [c for _, c in self.calls()]
        self.assertEqual(len([c for c in calls if c.startswith("scontrol")]), 2, calls)  # drained once it worked
        self.assertEqual(sorted(c for c in calls if c.startswith("scancel")),
                         ["scancel --signal=USR1 --batch 101", "scancel --signal=USR1 --batch 101",
                          "scancel --signal=USR1 --batch 102"])
        self.assertIsNone(self.proc.poll(), "the watcher exited")

    def test_a_job_listed_later_is_signalled_while_the_notice_stands(self):
        self.write("squeue.out", "101\n")
        self.imds.documents["spot/instance-action"] = '{"action": "terminate", "time": "2026-11-22T13:00:00Z"}'
        self.wait_for("scancel --signal=USR1 --batch 101", 30)
        self.write("squeue.out", "101\n103\n")  # (a job slurmctld had not yet shown running on the node)
        self.wait_for("scancel --signal=USR1 --batch 103", 30)
        self.wait_for_polls(len(self.imds.polls) + 2)
        self.assertEqual(len([c for _, c in self.calls() if c.startswith("scancel")]), 2, self.calls())

    def test_a_reply_cut_short_does_not_stop_the_watcher(self):
        """The metadata service's reply ends before its Content-Length (http.client's
        IncompleteRead): a warning, and the next poll asks again."""
        self.imds.truncated = 3
        self.imds.documents["spot/instance-action"] = '{"action": "terminate", "time": "2026-11-22T13:00:00Z"}'
        self.wait_for("scontrol update nodename=gpu-1 state=drain", 30)
        self.assertIsNone(self.proc.poll(), "the watcher exited")
        self.assertEqual(self.imds.truncated, 0)

    def test_a_rebalance_recommendation_drains_only(self):
        self.imds.documents["events/recommendations/rebalance"] = '{"noticeTime": "2026-11-22T12:58:00Z"}'
        self.wait_for("reason=hpctrain: spot rebalance recommendation", 30)
        self.wait_for_polls(len(self.imds.polls) + 2)
        self.assertEqual([c for _, c in self.calls() if c.startswith("scancel")], [])


if __name__ == "__main__":
    unittest.main()

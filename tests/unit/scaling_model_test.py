#!/usr/bin/env python3
"""bench/scaling_model.py on synthetic timelines whose answers are worked out by hand below, in both
timeline forms (JSON Lines and the Chrome trace), with and without overlap, flat and hierarchical;
hpctrain's regrouping into other bucket sizes; its sweep fit; and its bad input (one line, exit 2).

The timeline: one step, two buckets (arena end first) of 1 MB ready at 10 ms and 3 MB ready at
18 ms, the backward pass ending at 20 ms, a 25 ms step, batch 32. The cluster "t": 4 GPUs a node,
intra 1 GB/s and 10 us (beta 1e-9 s/B), inter 0.5 GB/s and 50 us (beta 2e-9 s/B).
"""
import contextlib
import io
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "scaling_model.py")
MS = 1e-3
sys.path.insert(0, os.path.dirname(MODEL))
import scaling_model  # noqa: E402  (bench/ is no package)

CLUSTERS = {"t": {"gpus_per_node": 4,
                  "intra": {"bandwidth_GBps": 1, "latency_us": 10, "source": "test"},
                  "inter": {"bandwidth_GBps": 0.5, "latency_us": 50, "source": "test"}}}
BUCKETS = [(750000, 1000000, 0.010), (0, 750000, 0.018)]  # begin, end (elements of 4 bytes), queued

# Worked by hand. One node, n = 4: a bucket of S bytes costs 2*3*10us + 2*3/4*S*1e-9 = 0.06 ms + 1.5 ns*S:
# 1.56 ms (10 -> 11.56) and 4.56 ms (18 -> 22.56): exposed 2.56 ms, step 27.56 ms.
# Without overlap both start at 20 ms: 20 -> 21.56 -> 26.12: exposed 6.12 ms.
# Two nodes, n = 8, flat: a chunk makes 2*7 hops, 2*(2-1) of them across the network, so
# 12*10us + 2*50us + 2*7/8*S*2e-9 = 0.22 ms + 3.5 ns*S: 3.72 ms (10 -> 13.72) and 10.72 ms (18 -> 28.72):
# exposed 8.72 ms. Hierarchical: reduce-scatter and all-gather in the node,
# 2 * (3*10us + 3/4*S*1e-9) = 0.06 ms + 1.5 ns*S, and between the 2 nodes an all-reduce of S/4 with
# the node's link shared by its 4 GPUs (beta 8e-9): 2*1*50us + 2*1/2*S/4*8e-9 = 0.1 ms + 2 ns*S;
# together 0.16 ms + 3.5 ns*S: 3.66 ms (10 -> 13.66) and 10.66 ms (18 -> 28.66): exposed 8.66 ms.
# The step boundary's agreement after each step, 5 + 2n doubles by recursive doubling (cluster t has no
# host_mpi_latency_us: its links' latencies): 4 GPUs, 104 bytes, log2 4 = 2 rounds in the node,
# 2 x (10 us + 104 x 1e-9 s) = 0.020208 ms; 8 GPUs (2 nodes), 168 bytes, 2 x (10 + 0.168) us + 1 x
# (50 + 168 x 2e-3) us = 0.070672 ms. Images/s and the efficiency count it; the step does not.
BOUNDARY = {1: 0.0, 4: 0.020208, 8: 0.070672}
EXPECTED = {  # (gpus, scheme, overlap): exposed ms
    (4, "ring", True): 2.56, (4, "ring", False): 6.12,
    (8, "flat", True): 8.72, (8, "hierarchical", True): 8.66,
}


def jsonl_timeline(buckets, backward=0.020, steps=(0,)):
    return "".join(json.dumps({"step": s, "bucket": i, "begin": b, "end": e, "queued": q, "started": q, "done": q,
                               "backward_done": backward, "finished": backward}) + "\n"
                   for s in steps for i, (b, e, q) in enumerate(buckets))


def chrome_timeline(buckets, backward=0.020):
    """The agreed Chrome trace: rank 0, step 7 starting 1 s into the run (microseconds)."""
    t0 = 1e6
    events = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "rank 0 (host)"}},
              {"name": "step 7", "ph": "X", "pid": 0, "tid": 0, "ts": t0, "dur": 25e3},
              {"name": "backward", "ph": "X", "pid": 0, "tid": 0, "ts": t0 + 8e3, "dur": backward * 1e6 - 8e3}]
    for i, (b, e, q) in enumerate(buckets):
        args = {"bucket": i, "begin": b, "end": e, "bytes": 4 * (e - b), "step": 7}
        events.append({"name": f"queue bucket {i}", "ph": "X", "pid": 0, "tid": 1, "ts": t0 + q * 1e6, "dur": 1,
                       "args": args})
        events.append({"name": f"queue bucket {i}", "ph": "X", "pid": 1, "tid": 1, "ts": t0, "dur": 1,
                       "args": args})  # rank 1's: not read
    return json.dumps(events)


class ScalingModelTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.clusters = self.write("clusters.json", json.dumps(CLUSTERS))

    def tearDown(self):
        self.dir.cleanup()

    def metrics(self, name, steps, world=1):
        """A metrics file of a run of `world` ranks (batch 32 a rank): its config event, then one step
        event for each (step_seconds, comm_wait_seconds)."""
        config = {"event": "config", "global_batch_size": 32 * world, "world_size": world}
        return self.write(name, json.dumps(config) + "\n" + "".join(
            json.dumps({"event": "step", "step_seconds": t, "comm_wait_seconds": w}) + "\n" for t, w in steps))

    def write(self, name, text):
        path = os.path.join(self.dir.name, name)
        with open(path, "wb" if isinstance(text, bytes) else "w") as f:
            f.write(text)
        return path

    def run_model(self, *args):
        """The model in this process (a process each would make the test slow): its code, stdout, stderr."""
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = scaling_model.cli(list(args))
        return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())

    def test_as_a_program(self):
        good = self.write("t.jsonl", jsonl_timeline(BUCKETS))
        base = [sys.executable, MODEL, "--timeline", good, "--step-seconds", "0.025", "--clusters", self.clusters]
        r = subprocess.run(base + ["--cluster", "t", "--gpus", "4"], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("27.560", r.stdout)  # the 4-GPU step in ms, as the table prints it
        r = subprocess.run(base + ["--cluster", "p9"], capture_output=True, text=True, timeout=60)
        self.assertEqual((r.returncode, r.stdout), (2, ""))
        self.assertEqual(r.stderr.count("\n"), 1, r.stderr)

    def predict(self, timeline, *extra):
        r = self.run_model("--timeline", timeline, "--step-seconds", "0.025", "--batch", "32", "--clusters",
                           self.clusters, "--cluster", "t", "--skip-steps", "0", "--json", *extra)
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout)

    def check_expected(self, timeline):
        for overlap in (True, False):
            out = self.predict(timeline, "--gpus", "1,4,8", *([] if overlap else ["--no-overlap"]))
            rows = {(r["gpus"], r["scheme"]): r for r in out["rows"]}
            self.assertEqual(rows[(1, "ring")]["exposed_seconds"], 0)
            self.assertAlmostEqual(rows[(1, "ring")]["step_seconds"], 25 * MS, delta=1e-12)
            for (gpus, scheme, on), exposed in EXPECTED.items():
                if on != overlap:
                    continue
                r = rows[(gpus, scheme)]
                with self.subTest(gpus=gpus, scheme=scheme, overlap=overlap):
                    self.assertAlmostEqual(r["exposed_seconds"], exposed * MS, delta=1e-9)
                    self.assertAlmostEqual(r["step_seconds"], (25 + exposed) * MS, delta=1e-9)
                    self.assertAlmostEqual(r["boundary_seconds"], BOUNDARY[gpus] * MS, delta=1e-12)
                    period = 25 + exposed + BOUNDARY[gpus]
                    self.assertAlmostEqual(r["efficiency"], 25 / period, delta=1e-9)
                    self.assertAlmostEqual(r["images_per_second"], gpus * 32 / (period * MS), delta=1e-6)

    def test_known_answer_from_json_lines(self):
        self.check_expected(self.write("t.jsonl", jsonl_timeline(BUCKETS)))

    def test_known_answer_from_chrome_trace(self):
        self.check_expected(self.write("t.json", chrome_timeline(BUCKETS)))
        wrapped = '{ "traceEvents": ' + chrome_timeline(BUCKETS) + ', "displayTimeUnit": "ms"}'
        self.check_expected(self.write("t2.json", wrapped))

    def test_a_trace_appended_to_by_resumed_runs(self):
        """hpctrain appends a resumed run's events to the trace (hpcrun's --resume auto): each run's clock
        starts again near 0, its steps keep their numbers, and a run resumed from a checkpoint older than
        the last gather repeats some. Here the known run (step 7, 1 s in), then a run resumed whose first
        step begins 0.5 s in: step 8 (it was refused: "step 7 ... has no 'step 7' and 'backward' events",
        the known step's backward taken for step 8's), or step 7 again (each bucket's queue time was
        0.5 s late in the known step, timed from the later run's step 7). Each step is timed against its
        own run's: the known answer."""
        first = json.loads(chrome_timeline(BUCKETS))

        def resumed(step, ts):  # the known step's events as step `step` of the next run, from ts
            events = []
            for e in json.loads(chrome_timeline(BUCKETS)):
                if e["ph"] == "X":
                    e["ts"] += ts - 1e6
                    if e["name"] == "step 7":
                        e["name"] = f"step {step}"
                    if "step" in e.get("args", {}):
                        e["args"]["step"] = step
                events.append(e)
            return events

        for step in (8, 7):
            with self.subTest(resumed_at=step):
                self.check_expected(self.write(f"resumed{step}.json", json.dumps(first + resumed(step, 5e5))))

    def test_median_over_steps_after_the_skipped(self):
        # Step 0 is a slow first step, left out by --skip-steps 1; steps 1-3 hold the known timeline.
        slow = "".join(jsonl_timeline([(b, e, q + 0.5) for b, e, q in BUCKETS], backward=0.6))
        path = self.write("t.jsonl", slow + jsonl_timeline(BUCKETS, steps=(1, 2, 3)))
        r = self.predict(path, "--gpus", "4", "--skip-steps", "1")
        self.assertAlmostEqual(r["rows"][0]["exposed_seconds"], 2.56 * MS, delta=1e-9)

    def test_the_slowest_rank_from_the_step_times_spread(self):
        # Compute steps of 24, 25, 26, 25, 24, 26, 25 ms: median 25, median absolute deviation 1 ms, so
        # sigma 1.4826 ms; the slowest of 4 ranks is late by sigma x 1.0293754 (E[max of 4 normals]) =
        # 1.5261 ms: both buckets ready that much later, 11.5261 -> 13.0861 and 19.5261 -> 24.0861,
        # exposed 2.56 + 1.5261 ms. The first step (500 ms) is skipped; wait is taken off the step.
        steps = [(0.5, 0)] + [(t * MS + 0.002, 0.002) for t in (24, 25, 26, 25, 24, 26, 25)]
        metrics = self.metrics("m.jsonl", steps)
        timeline = self.write("t.jsonl", jsonl_timeline(BUCKETS))
        r = self.run_model("--timeline", timeline, "--metrics", metrics, "--skip-steps", "1", "--clusters",
                           self.clusters, "--cluster", "t", "--gpus", "1,4", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        out = json.loads(r.stdout)
        self.assertAlmostEqual(out["step_sigma_seconds"], 1.4826 * MS, delta=1e-12)
        one, four = out["rows"]
        self.assertEqual(one["exposed_seconds"], 0)
        # The one-rank run waited 2 ms for its buckets each step: the hand-off (see
        # test_the_hand_off_to_the_communication_thread), 2 ms more of exposure.
        late = 1.4826 * 1.0293754 * MS
        self.assertAlmostEqual(four["exposed_seconds"], 2.56 * MS + late + 2 * MS, delta=1e-8)
        self.assertAlmostEqual(four["step_seconds"], 25 * MS + 2.56 * MS + late + 2 * MS, delta=1e-8)
        self.assertAlmostEqual(four["images_per_second"], 4 * 32 / (four["step_seconds"] + BOUNDARY[4] * MS), delta=1e-6)
        r = self.run_model("--timeline", timeline, "--metrics", metrics, "--skip-steps", "1", "--clusters",
                           self.clusters, "--cluster", "t", "--gpus", "4", "--json", "--no-jitter")
        self.assertAlmostEqual(json.loads(r.stdout)["rows"][0]["exposed_seconds"], 4.56 * MS, delta=1e-9)

    def test_one_ranks_trimmed_means_with_the_spread(self):
        """What scaling_check.sh measures: one rank's mean over its steps, the longest 5% left out. The
        spread and hand-off of test_the_slowest_rank_from_the_step_times_spread (sigma 1.4826 ms,
        h 2 ms), no overlap, so the exposed wait is e0 + the slowest rank's lateness behind this one.
        2 GPUs (2*10us + S*1e-9): 20 + 1 -> 22.02, -> 25.04, seen at 26.04: e0 6.04 ms. The lateness,
        sigma max(0, z1 - z0) with z1 - z0 ~ N(0, 2), less its top 5% (those of z1 - z0 over
        sqrt(2) q, q = Phi^-1(0.95)): sigma sqrt(2) (phi(0) - phi(q)) / 0.95 = 0.44035 sigma (the mean
        rank's, untrimmed: 0.5642 sigma). Its step, 25 + sigma z0 + 6.04 + sigma max(0, z1 - z0) =
        31.04 + sigma max(z0, z1) (CDF Phi^2), less its top 5%, less the trimmed sigma z0 the one rank's
        own trimmed mean already holds (-phi(q) / 0.95 sigma = -0.10857 sigma): worked out here
        independently (trapezoid rule), as is the lateness of 4 GPUs (0.06 ms + 1.5 ns*S: 21 -> 22.56, -> 27.12, seen
        at 28.12: e0 8.12 ms), whose CDF is G(d) = the integral of phi(z) Phi(z + d)^3 dz."""
        steps = [(t * MS + 0.002, 0.002) for t in (24, 25, 26, 25, 24, 26, 25)]
        metrics = self.metrics("m.jsonl", steps)
        r = self.run_model("--timeline", self.write("t.jsonl", jsonl_timeline(BUCKETS)), "--metrics", metrics,
                           "--skip-steps", "0", "--clusters", self.clusters, "--cluster", "t", "--gpus", "2,4",
                           "--no-overlap", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        two, four = json.loads(r.stdout)["rows"]
        sigma = 1.4826 * MS

        def phi(x):
            return math.exp(-x * x / 2) / math.sqrt(2 * math.pi)

        def cdf(x):
            return 0.5 * (1 + math.erf(x / math.sqrt(2)))

        def upper(f, p, lo=-8.0, hi=8.0):  # x with f(x) = p, f increasing
            for _ in range(60):
                lo, hi = ((lo + hi) / 2, hi) if f((lo + hi) / 2) < p else (lo, (lo + hi) / 2)
            return lo

        def integral(f, a, b, steps=20000):
            h = (b - a) / steps
            return h * (sum(f(a + i * h) for i in range(1, steps)) + (f(a) + f(b)) / 2)

        self.assertAlmostEqual(two["exposed_seconds"], 6.04 * MS + 0.5641896 * sigma, delta=1e-8)
        late2 = math.sqrt(2) * (phi(0) - phi(upper(cdf, 0.95))) / 0.95
        self.assertAlmostEqual(late2, 0.44035, places=4)
        # The grid of 128 x 128 quantiles: within 0.5% of sigma.
        self.assertAlmostEqual(two["parts"]["trimmed_late_seconds"], late2 * sigma, delta=0.005 * sigma)
        self.assertAlmostEqual(two["trimmed_exposed_seconds"], 6.04 * MS + late2 * sigma, delta=0.005 * sigma)
        q2 = upper(lambda x: cdf(x) ** 2, 0.95)
        step2 = integral(lambda x: x * 2 * phi(x) * cdf(x), -8, q2) / 0.95
        own = -phi(upper(cdf, 0.95)) / 0.95
        self.assertAlmostEqual(own, -0.10857, places=4)
        self.assertAlmostEqual(two["trimmed_step_seconds"], 31.04 * MS + (step2 - own) * sigma, delta=0.005 * sigma)
        # The one rank's centre is its trimmed mean, not its median: the same steps and a 29 ms one
        # (8 steps, none trimmed: mean 25.5 ms, median 25, the spread the same).
        skewed = self.metrics("m8.jsonl", steps + [(0.031, 0.002)])
        r = self.run_model("--timeline", self.write("t.jsonl", jsonl_timeline(BUCKETS)), "--metrics", skewed,
                           "--skip-steps", "0", "--clusters", self.clusters, "--cluster", "t", "--gpus", "1,2",
                           "--no-overlap", "--json")
        one, skew = json.loads(r.stdout)["rows"]
        self.assertAlmostEqual(one["step_seconds"], 25 * MS, delta=1e-12)
        self.assertAlmostEqual(one["trimmed_step_seconds"], 25.5 * MS, delta=1e-12)
        self.assertAlmostEqual(skew["trimmed_step_seconds"], two["trimmed_step_seconds"] + 0.5 * MS, delta=1e-12)

        def late_below(d):  # P(max of the 3 others - z <= d), d >= 0
            return integral(lambda z: phi(z) * cdf(z + d) ** 3, -8, 8, 4000)
        q4 = upper(late_below, 0.95, 0.0, 6.0)
        late4 = (0.95 * q4 - integral(late_below, 0, q4, 400)) / 0.95  # E[D; D <= q] = q G(q) - int G
        self.assertGreater(late4, late2)
        self.assertAlmostEqual(four["parts"]["trimmed_late_seconds"], late4 * sigma, delta=0.005 * sigma)
        self.assertAlmostEqual(four["trimmed_exposed_seconds"], 8.12 * MS + late4 * sigma, delta=0.005 * sigma)

    def test_the_statistics_average_ahead_of_the_buckets(self):
        """hpctrain's batch-norm statistics' average, one call a step: 1000 values (4000 bytes), queued
        at 8 ms (the forward pass's end). 4 GPUs: 0.06 ms + 1.5 ns x 4000 = 0.066 ms. With overlap it
        runs 8 -> 8.066, before bucket 0 is ready: exposed 2.56 ms as without it. Without overlap it
        is held to the backward end and goes first: 20 -> 20.066, then the buckets 20.066 -> 21.626 ->
        26.186: exposed 6.186 ms. Both timeline forms carry it; --other-framework leaves it (and the
        step boundary) out: 6.12 ms. --arch resnet50: a mean and a variance for each of its 26,560
        batch-norm channels (stem 64; stages 3 x 384 + 256, 4 x 768 + 512, 6 x 1536 + 1024,
        3 x 3072 + 2048), 212,480 bytes, queued at a third of the step."""
        lines = jsonl_timeline(BUCKETS).splitlines()
        jsonl = "".join(json.dumps({**json.loads(l), "statistics_values": 1000, "statistics_queued": 0.008,
                                    "statistics_started": 0.008, "statistics_done": 0.008}) + "\n" for l in lines)
        trace = json.loads(chrome_timeline(BUCKETS))
        t0 = next(e["ts"] for e in trace if e.get("name") == "step 7")
        trace.append({"name": "queue statistics", "ph": "X", "pid": 0, "tid": 1, "ts": t0 + 8e3, "dur": 1,
                      "args": {"values": 1000, "bytes": 4000, "step": 7}})
        for name, path in (("jsonl", self.write("s.jsonl", jsonl)), ("chrome", self.write("s.json", json.dumps(trace)))):
            with self.subTest(timeline=name):
                on = self.predict(path, "--gpus", "4")
                self.assertEqual(on["statistics"], {"bytes": 4000, "ready_seconds": 0.008})
                self.assertAlmostEqual(on["rows"][0]["exposed_seconds"], 2.56 * MS, delta=1e-9)
                st = on["rows"][0]["parts"]["statistics"]
                self.assertAlmostEqual(st["start_seconds"], 8 * MS, delta=1e-9)
                self.assertAlmostEqual(st["allreduce_seconds"], 0.066 * MS, delta=1e-9)
                off = self.predict(path, "--gpus", "4", "--no-overlap")
                self.assertAlmostEqual(off["rows"][0]["exposed_seconds"], 6.186 * MS, delta=1e-9)
                self.assertAlmostEqual(off["rows"][0]["parts"]["buckets"][0]["start_seconds"], 20.066 * MS, delta=1e-9)
                other = self.predict(path, "--gpus", "4", "--no-overlap", "--other-framework")
                self.assertIsNone(other["statistics"])
                self.assertAlmostEqual(other["rows"][0]["exposed_seconds"], 6.12 * MS, delta=1e-9)
                self.assertEqual(other["rows"][0]["boundary_seconds"], 0)
        plain = self.predict(self.write("t.jsonl", jsonl_timeline(BUCKETS)), "--gpus", "4")
        self.assertIsNone(plain["statistics"])  # a timeline without the call (one of before 2026-11-29)
        # Steps 0 and 1 written by an older build, step 2 with the call: step 2 says what it is.
        mixed = jsonl_timeline(BUCKETS, steps=(0, 1)) + "".join(
            json.dumps({**json.loads(l), "step": 2}) + "\n" for l in jsonl.splitlines())
        self.assertEqual(self.predict(self.write("mixed.jsonl", mixed), "--gpus", "4")["statistics"],
                         {"bytes": 4000, "ready_seconds": 0.008})
        # The boundary with the local machine's MPI fits (4 ranks: 10 us, 1 GB/s): 2 x 3 x 10 us +
        # 2 x 3/4 x 104 bytes x 1e-9 s = 60.156 us.
        fitted = self.write("fits.json", json.dumps({"f": dict(CLUSTERS["t"], fits={
            "4": {"bandwidth_GBps": 1, "latency_us": 10}})}))
        r = self.run_model("--timeline", path, "--step-seconds", "0.025", "--clusters", fitted, "--cluster", "f",
                           "--gpus", "4", "--skip-steps", "0", "--json")
        self.assertAlmostEqual(json.loads(r.stdout)["rows"][0]["boundary_seconds"], 60.156e-6, delta=1e-12)
        r = self.run_model("--arch", "resnet50", "--step-seconds", "0.3", "--batch", "64", "--clusters",
                           self.clusters, "--cluster", "t", "--gpus", "4", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        st = json.loads(r.stdout)["statistics"]
        self.assertEqual(st["bytes"], 212480)
        self.assertAlmostEqual(st["ready_seconds"], 0.1, delta=1e-12)

    def test_the_hand_off_to_the_communication_thread(self):
        """A one-rank CPU run's wait for its buckets is the hand-off h alone (nothing to all-reduce):
        here 0.4 ms a step (median), so each bucket starts h/2 after it is ready and the main thread
        sees the last end h/2 later. 4 GPUs: 10.2 -> 11.76 and 18.2 -> 22.76, seen at 22.96: exposed
        2.96 ms. Without overlap both are handed over at 20 ms: 20.2 -> 21.76 -> 26.32, seen at 26.52:
        6.52 ms. No hand-off from a run of several ranks (its wait holds all-reduces), nor with
        --scale-to (another device's step: no thread of ours)."""
        def metrics(world):
            return self.metrics(f"m{world}.jsonl", [(0.0254 + w, 0.0004 + w) for w in (0, 0.0001, -0.0001)], world)
        timeline = self.write("t.jsonl", jsonl_timeline(BUCKETS))
        base = ["--timeline", timeline, "--skip-steps", "0", "--clusters", self.clusters, "--cluster", "t",
                "--gpus", "1,4", "--json", "--no-jitter"]
        for extra, want_on, want_off in ((["--metrics", metrics(1)], 2.96, 6.52),
                                         (["--metrics", metrics(2)], 2.56, 6.12),
                                         (["--metrics", metrics(1), "--scale-to", "0.025"], 2.56, 6.12)):
            with self.subTest(extra=extra):
                on = json.loads(self.run_model(*base, *extra).stdout)
                off = json.loads(self.run_model(*base, *extra, "--no-overlap").stdout)
                self.assertEqual(on["rows"][0]["exposed_seconds"], 0)  # one GPU: the step itself
                self.assertAlmostEqual(on["rows"][0]["step_seconds"], 25 * MS, delta=1e-9)
                self.assertAlmostEqual(on["rows"][1]["exposed_seconds"], want_on * MS, delta=1e-9)
                self.assertAlmostEqual(off["rows"][1]["exposed_seconds"], want_off * MS, delta=1e-9)
                # --explain's parts: each bucket's wake-up, none for one queued behind another.
                h = (want_on - 2.56) / 2
                for out, want in ((on, [h, h]), (off, [h, 0])):
                    got = [b["handoff_seconds"] for b in out["rows"][1]["parts"]["buckets"]]
                    self.assertEqual([round(x / MS, 9) for x in got], [round(x, 9) for x in want])

    def test_nccl_picks_its_tree_or_its_ring(self):
        """NCCL's tree beside its ring (the "nccl" scheme: the faster per call, as NCCL picks). Cluster t
        with a tree (base 20 us, hops 10 us in a node and 50 across) and a network overhead of 5 us
        (x3 = 15 us, over t's 10 us NVLink hop: each ring hop inside a node costs 15 us once the ring
        spans nodes). 16 GPUs (4 nodes of 4):
        - 64 bytes: tree 20 + 2 x (3 x 10 + log2(4) x 50) = 280 us, + 64 / (0.5e9 x 0.92 x 0.5 x 0.9
          (the correction at log2(64/64) = 0)) = 0.309179 us; ring 2 x 15 hops, 6 across the network:
          24 x 15 + 6 x 50 = 660 us + 2 x 15/16 x 64 x 2e-9 s: the tree, 280.309179 us.
        - 64 MB: the tree's bandwidth x 0.7 (log2(1e6) = 19): 280 us + 64e6 / (0.5e9 x 0.92 x 0.5 x
          0.7) s = 0.397515 s; the ring 660 us + 0.24 s = 0.24066 s: the ring.
        The flat column stays a ring (660.24 us for 64 bytes); a cluster without a tree has no
        "nccl" column; inside one node the ring's hops are t's own (no overhead): 4 GPUs, 60 us."""
        c = dict(CLUSTERS["t"], net_overhead_us=5,
                 tree={"base_latency_us": 20, "intra_latency_us": 10, "inter_latency_us": 50, "source": "test"})
        path = self.write("tree.json", json.dumps({"c": c, "t": CLUSTERS["t"]}))
        small = self.write("small.jsonl", jsonl_timeline([(0, 16, 0.019)]))  # one bucket of 64 bytes
        big = self.write("big.jsonl", jsonl_timeline([(0, 16000000, 0.019)]))  # 64 MB
        for timeline, want in ((small, {"nccl": 280.309179, "flat": 660.24}), (big, {"nccl": 240660, "flat": 240660})):
            r = self.run_model("--timeline", timeline, "--step-seconds", "0.025", "--clusters", path, "--cluster", "c",
                               "--gpus", "4,16", "--no-overlap", "--other-framework", "--skip-steps", "0", "--json")
            self.assertEqual(r.returncode, 0, r.stderr)
            rows = {(x["gpus"], x["scheme"]): x for x in json.loads(r.stdout)["rows"]}
            for scheme, us in want.items():
                got = rows[(16, scheme)]["parts"]["buckets"][0]["allreduce_seconds"]
                self.assertAlmostEqual(got, us * 1e-6, delta=1e-11 + 1e-9 * us * 1e-6, msg=(timeline, scheme))
            self.assertNotIn((4, "nccl"), rows)
            self.assertAlmostEqual(rows[(4, "ring")]["parts"]["buckets"][0]["allreduce_seconds"],
                                   60e-6 + 1.5e-9 * (64 if timeline == small else 64e6), delta=1e-12)
        r = self.run_model("--timeline", small, "--step-seconds", "0.025", "--clusters", path, "--cluster", "t",
                           "--gpus", "16", "--json")
        self.assertEqual(sorted(x["scheme"] for x in json.loads(r.stdout)["rows"]), ["flat", "hierarchical"])

    def test_base_latency_and_plateau_as_nccl_charges_them(self):
        """NCCL's ring latency: its base once per call, and across nodes x the plateau factor for all
        but tiny messages. Cluster t with a 20 us base and a plateau of 1.5, 1 MB on 8 GPUs (2 nodes):
        flat (20 + 12*10 + 2*50 us) * 1.5 = 0.36 ms + 3.5 ms; hierarchical: 2 * (20 + 3*10 us + 0.75 ms)
        in the nodes + (20 + 2*50 us) * 1.5 = 0.18 ms + 2 ms between them (250 kB, the link shared by 4). One node (4 GPUs): no
        plateau, 20 + 6*10 us + 1.5 ms. 4 bytes on 8 GPUs (under 64 a rank): no plateau either."""
        c = dict(CLUSTERS["t"], ring_base_latency_us=20, ring_plateau=1.5)
        cluster = scaling_model.load_cluster(self.write("c.json", json.dumps({"c": c})), "c")
        cost = scaling_model.allreduce_seconds
        self.assertAlmostEqual(cost(1e6, 8, cluster, "flat"), 0.36 * MS + 3.5 * MS, delta=1e-12)
        self.assertAlmostEqual(cost(1e6, 8, cluster, "hierarchical"), 1.6 * MS + 0.18 * MS + 2 * MS, delta=1e-12)
        self.assertAlmostEqual(cost(1e6, 4, cluster, "flat"), 0.08 * MS + 1.5 * MS, delta=1e-12)
        self.assertAlmostEqual(cost(4, 8, cluster, "flat"), 0.24 * MS + 2 * 7 / 8 * 4 * 2e-9, delta=1e-12)
        bad = self.write("bad.json", json.dumps({"c": dict(c, ring_plateau=0.5)}))
        r = self.run_model("--arch", "vgg16", "--step-seconds", "0.5", "--batch", "64", "--clusters", bad,
                           "--cluster", "c")
        self.assertEqual((r.returncode, r.stderr.count("\n")), (2, 1), r.stderr)
        self.assertIn("ring_plateau", r.stderr)

    def test_a_framework_cycle_delays_each_bucket_to_its_next_tick(self):
        """--cycle-ms 4 on 4 GPUs: the buckets ready at 10 and 18 ms start at the ticks of 12 and 20 ms:
        12 -> 13.56 and 20 -> 24.56, exposed 4.56 ms (2.56 without the cycle)."""
        path = self.write("t.jsonl", jsonl_timeline(BUCKETS))
        out = self.predict(path, "--gpus", "4", "--cycle-ms", "4")
        self.assertAlmostEqual(out["rows"][0]["exposed_seconds"], 4.56 * MS, delta=1e-9)
        out = self.predict(path, "--gpus", "4", "--cycle-ms", "2")  # ticks at 10 and 18: no delay
        self.assertAlmostEqual(out["rows"][0]["exposed_seconds"], 2.56 * MS, delta=1e-9)

    def test_ranks_beyond_the_cores_wait_for_the_busiest_core(self):
        """3 ranks on 2 cores: the busiest core runs two ranks' steps (stretch 2, not 1.5); 4 on 2: 2;
        2 on 2 and any rank count without cores_per_node: 1."""
        stretch = scaling_model.busy_stretch
        self.assertEqual(stretch({"cores_per_node": 2}, 3), 2.0)
        self.assertEqual(stretch({"cores_per_node": 2}, 4), 2.0)
        self.assertEqual(stretch({"cores_per_node": 2}, 5), 3.0)
        self.assertEqual(stretch({"cores_per_node": 2}, 2), 1.0)
        self.assertEqual(stretch({}, 8), 1.0)

    def test_regrouping_into_larger_buckets(self):
        # Groups, arena end first: 0.5 MB at 5 ms, 0.7 MB at 8 ms, 2 MB at 12 ms, 1 MB at 19 ms. At 2 MB
        # buckets hpctrain cuts the first at 1 MiB (0.5 + 0.7 MB, ready at 8 ms), then 2 MB (12 ms),
        # then the rest (1 MB, 19 ms).
        groups = [(3050000, 3175000, 0.005), (2875000, 3050000, 0.008), (2375000, 2875000, 0.012),
                  (2125000, 2375000, 0.019)]
        groups = [(b - 2125000, e - 2125000, q) for b, e, q in groups]
        path = self.write("t.jsonl", jsonl_timeline(groups))
        out = self.predict(path, "--gpus", "4", "--bucket-mb", "2")
        self.assertEqual([(b["bytes"], b["ready_seconds"]) for b in out["buckets"]],
                         [(1200000, 0.008), (2000000, 0.012), (1000000, 0.019)])
        # 4 ranks: 1.86 ms (8 -> 9.86), 3.06 ms (12 -> 15.06), 1.56 ms (19 -> 20.56): exposed 0.56 ms.
        self.assertAlmostEqual(out["rows"][0]["exposed_seconds"], 0.56 * MS, delta=1e-9)
        best = out["rows"][0]
        self.assertLessEqual(best["best_bucket_exposed_seconds"], best["exposed_seconds"] + 1e-12)

    def test_arch_counts_the_published_parameters(self):
        # torchvision's counts: VGG-16 138,357,544, ResNet-50 25,557,032, ResNet-101 44,549,160.
        for arch, params in (("vgg16", 138357544), ("resnet50", 25557032), ("resnet101", 44549160)):
            r = self.run_model("--arch", arch, "--step-seconds", "0.5", "--batch", "64", "--clusters", self.clusters,
                               "--cluster", "t", "--gpus", "4", "--json")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(sum(b["bytes"] for b in json.loads(r.stdout)["buckets"]), 4 * params, arch)

    def test_fit_sweep_recovers_alpha_and_beta(self):
        # Points made from alpha 20 us and 2 GB/s on 3 ranks: 2*2*alpha + 2*2/3*S/2e9.
        lines = "".join(json.dumps({"ranks": 3, "bytes": s, "seconds": 4 * 20e-6 + 4 / 3 * s / 2e9}) + "\n"
                        for s in (4, 1024, 65536, 4194304))
        r = self.run_model("--fit-sweep", self.write("sweep.jsonl", lines))
        self.assertEqual(r.returncode, 0, r.stderr)
        fit = json.loads(r.stdout)["fits"]["3"]
        self.assertAlmostEqual(fit["latency_us"], 20, places=2)
        self.assertAlmostEqual(fit["bandwidth_GBps"], 2, places=3)

    def expect_usage_error(self, args, needle):
        r = self.run_model(*args)
        self.assertEqual(r.returncode, 2, r.stderr)
        lines = r.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertIn("scaling_model: error:", lines[0])
        self.assertIn(needle, lines[0])

    def test_explain_takes_a_run_of_several_ranks_apart(self):
        """--explain on a 2-rank Chrome trace whose parts are known. Each rank's clock has its own zero
        (rank 1's 123 ms later). Steps 1 to 3, in ms from each step's start (rank 0 | rank 1): the
        backward pass ends at 8 | 9; bucket 0 queued at 4.0, its all-reduce from 4.1 | 4.2 for 0.6 |
        0.5 (ends 4.7 on both: the fastest took 0.5, rank 0 waited 0.1 inside it); bucket 1 queued at
        4.3, behind bucket 0, from 4.75 for 0.25 (its hand-over is from bucket 0's end: 0.05); bucket 2
        queued at the backward end, from 9.05 for 0.3 (hand-over 1.05 | 0.05); the optimizer at 9.45.
        So the last end comes 1.35 | 0.35 after the backward end, rank 0 waits 1.0 for rank 1, and
        the main threads wait 1.45 | 0.45. Step 0, all twice as long, is left out (--skip-steps 1)."""
        def events(rank, step, t0, k=1.0, last_bucket=True, statistics=False):
            back = 8.0 if rank == 0 else 9.0
            out = [("step %d" % step, 0, 0.0, 10.0), ("backward", 0, 2.0, back - 2.0), ("optimizer", 0, 9.45, 0.2)]
            if statistics:  # queued at 3.9, from 3.95 for 0.1: bucket 0 waits for its end (4.05)
                out += [("queue statistics", 1, 3.9, 0.05), ("allreduce statistics", 1, 3.95, 0.1)]
            for b, queued, start, dur in ((0, 4.0, (4.1, 4.2)[rank], (0.6, 0.5)[rank]), (1, 4.3, 4.75, 0.25),
                                          (2, back, 9.05, 0.3))[:3 if last_bucket else 2]:
                out += [(f"queue bucket {b}", 1, queued, start - queued), (f"allreduce bucket {b}", 1, start, dur)]
            return [{"name": n, "ph": "X", "pid": rank, "tid": tid, "ts": (t0 + k * t) * 1e3, "dur": k * d * 1e3,
                     "args": {"step": step, **({"bucket": 0} if tid else {})}} for n, tid, t, d in out]
        trace = [{"name": "process_name", "ph": "M", "pid": r, "tid": 0, "args": {"name": f"rank {r}"}} for r in (0, 1)]
        for rank in (0, 1):
            trace += events(rank, 0, 123.0 * rank, k=2.0)
            for step in (1, 2, 3):
                trace += events(rank, step, 123.0 * rank + 20.0 * step)
        path = self.write("trace.json", json.dumps(trace))
        r = self.run_model("--explain", path, "--skip-steps", "1", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        m = json.loads(r.stdout)["measured"]
        self.assertEqual((m["ranks"], m["steps"]), (2, 3))
        for got, want in zip(m["allreduce_fastest_seconds"], (0.5, 0.25, 0.3)):
            self.assertAlmostEqual(got, want * MS, delta=1e-9)
        want = {0: (8, 1.0, 1.35, 1.45, (0.1, 0.05, 1.05), (0.1, 0, 0)),
                1: (9, 0.0, 0.35, 0.45, (0.2, 0.05, 0.05), (0, 0, 0))}
        for rank in m["per_rank"]:
            back, late, last, main, handoffs, inside = want[rank["rank"]]
            with self.subTest(rank=rank["rank"]):
                self.assertAlmostEqual(rank["backward_done_seconds"], back * MS, delta=1e-9)
                self.assertAlmostEqual(rank["waits_for_slowest_seconds"], late * MS, delta=1e-9)
                self.assertAlmostEqual(rank["last_end_after_backward_seconds"], last * MS, delta=1e-9)
                self.assertAlmostEqual(rank["main_wait_seconds"], main * MS, delta=1e-9)
                for b, (h, w) in enumerate(zip(handoffs, inside)):
                    self.assertAlmostEqual(rank["buckets"][b]["handoff_seconds"], h * MS, delta=1e-9)
                    self.assertAlmostEqual(rank["buckets"][b]["waiting_inside_seconds"], w * MS, delta=1e-9)
        # Beside the model's parts (cluster t, as many GPUs as the trace has ranks): 2 ranks, a bucket of
        # S bytes 0.02 ms + 1 ns x S: 1 MB ready at 10 ms -> 11.02, 3 MB at 18 -> 21.02, exposed 1.02 ms.
        timeline = self.write("t.jsonl", jsonl_timeline(BUCKETS))
        r = self.run_model("--explain", path, "--timeline", timeline, "--step-seconds", "0.025", "--clusters",
                           self.clusters, "--cluster", "t", "--skip-steps", "0", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        p = json.loads(r.stdout)["predicted"]
        self.assertEqual(p["gpus"], 2)
        self.assertAlmostEqual(p["exposed_seconds"], 1.02 * MS, delta=1e-9)
        self.assertEqual([round(b["allreduce_seconds"] / MS, 9) for b in p["parts"]["buckets"]], [1.02, 3.02])
        r = self.run_model("--explain", path, "--timeline", timeline, "--step-seconds", "0.025", "--clusters",
                           self.clusters, "--cluster", "t", "--skip-steps", "0")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("the main thread waits: backward end to the optimizer", r.stdout)
        # Step 0 (twice as long) is kept here: means of 4 steps, none of them trimmed (5% of 4 is none):
        # (2.9 + 3 x 1.45) / 4 = 1.8125 | (0.9 + 3 x 0.45) / 4 = 0.5625.
        self.assertRegex(r.stdout, r"main thread waits.* 1\.020 +1\.812 +0\.562\n")
        # Without bucket 2, every all-reduce ends (at 5.0) before either backward pass: neither rank
        # waits for its buckets nor, so far as the buckets tell, for the other rank.
        early = [e for rank in (0, 1) for step in (1, 2) for e in events(rank, step, 20.0 * step, last_bucket=False)]
        r = self.run_model("--explain", self.write("early.json", json.dumps(early)), "--skip-steps", "0", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        for rank in json.loads(r.stdout)["measured"]["per_rank"]:
            self.assertEqual((rank["last_end_after_backward_seconds"], rank["waits_for_slowest_seconds"]), (0, 0))
        # The batch-norm statistics' average, the thread's first call: its own parts, and bucket 0's
        # hand-over counted from its end (4.05): 0.05 | 0.15.
        stats = [e for rank in (0, 1) for step in (1, 2) for e in events(rank, step, 20.0 * step, statistics=True)]
        r = self.run_model("--explain", self.write("stats.json", json.dumps(stats)), "--skip-steps", "0", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        m = json.loads(r.stdout)["measured"]
        self.assertAlmostEqual(m["statistics_allreduce_fastest_seconds"], 0.1 * MS, delta=1e-9)
        for rank, first in zip(m["per_rank"], (0.05, 0.15)):
            self.assertAlmostEqual(rank["statistics"]["handoff_seconds"], 0.05 * MS, delta=1e-9)
            self.assertAlmostEqual(rank["statistics"]["queued_seconds"], 3.9 * MS, delta=1e-9)
            self.assertAlmostEqual(rank["buckets"][0]["handoff_seconds"], first * MS, delta=1e-9)
        # Not a trace of several ranks: one line, exit 2.
        self.expect_usage_error(["--explain", self.write("one.json", json.dumps([e for e in trace if e["pid"] == 0]))],
                                "explain needs a run of several")
        self.expect_usage_error(["--explain", timeline], "is not a Chrome trace")

    def test_bad_input_is_one_line_and_exit_2(self):
        good = self.write("t.jsonl", jsonl_timeline(BUCKETS))
        base = ["--step-seconds", "0.025", "--clusters", self.clusters, "--cluster", "t"]
        self.expect_usage_error(["--timeline", os.path.join(self.dir.name, "missing.jsonl"), *base], "not found")
        self.expect_usage_error(["--timeline", self.write("empty.jsonl", ""), *base], "is empty")
        self.expect_usage_error(["--timeline", self.write("bad.jsonl", "{\"step\": 0}\n"), *base], "line 1")
        self.expect_usage_error(["--timeline", good, "--step-seconds", "0.025", "--clusters", self.clusters,
                                 "--cluster", "p9"], "unknown cluster 'p9'")
        self.expect_usage_error(["--timeline", self.write("zero.jsonl", jsonl_timeline([(5, 5, 0.01)])), *base],
                                "no elements")
        self.expect_usage_error(["--timeline", good, *base, "--bucket-mb", "0"], "must be positive")
        self.expect_usage_error(["--timeline", good, *base[2:], "--step-seconds", "-1"], "must be positive")
        self.expect_usage_error(["--timeline", good, *base, "--gpus", "6"], "do not fill nodes")
        self.expect_usage_error(["--timeline", good, *base, "--gpus", "0"], "positive")
        self.expect_usage_error(["--timeline", good, *base[2:]], "one-rank step time")
        self.expect_usage_error(["--fit-sweep", self.write("empty_sweep.jsonl", "")], "is empty")
        self.expect_usage_error(["--timeline", good, *base[:4], "--cluster", "t", "--clusters",
                                 self.write("c.json", "{")], "not JSON")

    def refuse_each(self, cases):
        """cases: (args, needle): each one line naming the problem, exit 2, nothing on stdout."""
        for args, needle in cases:
            with self.subTest(args=args[:2], needle=needle):
                self.expect_usage_error(args, needle)
                self.assertEqual(self.run_model(*args).stdout, "")

    def test_bad_option_values(self):
        """Every number option finite and in its range (inf/nan became "no communication" or a
        traceback); --arch takes --step-seconds, not --metrics (which it ignored)."""
        good = self.write("t.jsonl", jsonl_timeline(BUCKETS))
        base = ["--timeline", good, "--step-seconds", "0.025", "--clusters", self.clusters, "--cluster", "t"]
        metrics = self.metrics("m.jsonl", [(0.025, 0)] * 3)
        self.refuse_each([
            ([*base, "--cycle-ms", "inf"], "argument --cycle-ms: must be finite, got 'inf'"),
            ([*base, "--cycle-ms", "nan"], "argument --cycle-ms: must be finite, got 'nan'"),
            ([*base, "--cycle-ms", "1e300"], "argument --cycle-ms: must be at most 86400000"),
            ([*base, "--bucket-mb", "inf"], "argument --bucket-mb: must be finite"),
            ([*base, "--bucket-mb", "1e300"], "argument --bucket-mb: must be at most"),
            ([*base, "--step-seconds", "inf"], "argument --step-seconds: must be finite"),
            ([*base, "--step-seconds", "1e9"], "argument --step-seconds: must be at most 86400"),
            ([*base, "--scale-to", "inf"], "argument --scale-to: must be finite"),
            ([*base, "--scale-to", "1e999"], "argument --scale-to: must be finite, got '1e999'"),
            ([*base, "--batch", "100000000000"], "argument --batch: must be at most"),
            ([*base, "--batch", "1.5"], "argument --batch: not an integer: '1.5'"),
            ([*base, "--gpus", "4,100000000000000"], "GPU counts must be at most 1000000"),
            (["--arch", "vgg16", "--metrics", metrics, "--clusters", self.clusters, "--cluster", "t"],
             "--arch takes the step time from --step-seconds"),
            (["--arch", "vgg16", "--metrics", metrics, "--step-seconds", "0.5", "--clusters", self.clusters,
              "--cluster", "t"], "not --metrics"),
        ])
        # The largest GPU count computes (the slowest of a million ranks: no StatisticsError).
        r = self.run_model("--timeline", good, "--metrics", metrics, "--clusters", self.clusters, "--cluster", "t",
                           "--skip-steps", "0", "--gpus", "1000000", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_bad_clusters(self):
        """Every figure of a preset a JSON number (not a string, not a bool), finite, in its range,
        integral where it counts; every part an object; the file an object of presets, UTF-8."""
        full = dict(CLUSTERS["t"], cores_per_node=2, ring_base_latency_us=1, ring_plateau=1.4, net_overhead_us=1,
                    host_mpi_latency_us={"intra": 1, "inter": 10},
                    tree={"base_latency_us": 20, "intra_latency_us": 10, "inter_latency_us": 50},
                    fits={"_source": "test", "2": {"bandwidth_GBps": 1, "latency_us": 10}})
        timeline = self.write("t.jsonl", jsonl_timeline(BUCKETS))

        def changed(path, value):  # full with path (keys) set to value, or left out (value None)
            c = json.loads(json.dumps(full))
            d = c
            for k in path[:-1]:
                d = d[k]
            if value is None:
                del d[path[-1]]
            else:
                d[path[-1]] = value
            return {"c": c}

        cases = [  # (path, value, needle)
            (["gpus_per_node"], "8", 'gpus_per_node must be an integer, got "8"'),
            (["gpus_per_node"], True, "gpus_per_node must be an integer, got true"),
            (["gpus_per_node"], 0, "gpus_per_node must be positive"),
            (["gpus_per_node"], None, "lacks gpus_per_node"),
            (["cores_per_node"], 0.5, "cores_per_node must be an integer, got 0.5"),
            (["cores_per_node"], 0, "cores_per_node must be positive"),
            (["cores_per_node"], -2, "cores_per_node must be positive"),
            (["cores_per_node"], "2", "cores_per_node must be an integer"),
            (["fits"], [], "fits must be a JSON object, got []"),
            (["fits"], "x", 'fits must be a JSON object, got "x"'),
            (["fits", "two"], {"bandwidth_GBps": 1, "latency_us": 1}, "fits key 'two' is not a rank count"),
            (["fits", "2", "latency_us"], math.nan, "fits.2.latency_us must be finite, got NaN"),
            (["intra"], [1, 2], "intra must be a JSON object"),
            (["inter"], None, "lacks inter"),
            (["inter", "bandwidth_GBps"], "inf", 'inter.bandwidth_GBps must be a number, got "inf"'),
            (["inter", "bandwidth_GBps"], math.inf, "inter.bandwidth_GBps must be finite, got Infinity"),
            (["inter", "bandwidth_GBps"], 1e308, "inter.bandwidth_GBps must be at most 1000000"),
            (["inter", "bandwidth_GBps"], 1e-300, "inter.bandwidth_GBps must be at least 0.001"),
            (["inter", "latency_us"], "inf", "inter.latency_us must be a number"),
            (["inter", "latency_us"], 1e308, "inter.latency_us must be at most 1000000"),
            (["intra", "latency_us"], -1, "intra.latency_us must be at least 0"),
            (["host_mpi_latency_us"], [1, 2], "host_mpi_latency_us must be a JSON object"),
            (["host_mpi_latency_us", "inter"], -1e6, "host_mpi_latency_us.inter must be at least 0"),
            (["host_mpi_latency_us", "inter"], math.nan, "host_mpi_latency_us.inter must be finite"),
            (["tree", "inter_latency_us"], -1000, "tree.inter_latency_us must be at least 0"),
            (["tree", "intra_latency_us"], math.nan, "tree.intra_latency_us must be finite"),
            (["tree"], 5, "tree must be a JSON object"),
            (["net_overhead_us"], -1, "net_overhead_us must be at least 0"),
            (["net_overhead_us"], math.nan, "net_overhead_us must be finite"),
            (["ring_plateau"], math.inf, "ring_plateau must be finite"),
            (["ring_base_latency_us"], "8.4", "ring_base_latency_us must be a number"),
        ]
        args = ["--timeline", timeline, "--step-seconds", "0.025", "--cluster", "c", "--gpus", "1,2,4,8"]
        self.assertEqual(self.run_model(*args, "--clusters", self.write("c.json", json.dumps({"c": full}))).returncode,
                         0)
        self.refuse_each([([*args, "--clusters", self.write(f"c{i}.json", json.dumps(changed(path, value)))],
                           f"cluster 'c' in {self.dir.name}/c{i}.json{' ' if 'lacks' in needle else ': '}{needle}")
                          for i, (path, value, needle) in enumerate(cases)])
        files = [("[1, 2, 3]", "is not a JSON object of presets"), ('"abc"', "is not a JSON object of presets"),
                 ("5", "is not a JSON object of presets"), ('{"c": 5}', "cluster 'c' in"),
                 (b'{"c\xff": 1}', "is not UTF-8 text")]
        self.refuse_each([([*args, "--clusters", self.write(f"f{i}.json", text)], needle)
                          for i, (text, needle) in enumerate(files)])

    def test_bad_timelines(self):
        """Every figure of a timeline finite and in range (a bucket queued no later than about the
        backward pass's end), no two buckets over the same elements; a Chrome trace's events with
        their numbers; a file that is not one (empty, not a regular file, not UTF-8, a trace cut
        short) named as such."""
        def lines(**change):  # the known timeline with one bucket line's fields changed
            rows = [json.loads(l) for l in jsonl_timeline(BUCKETS).splitlines()]
            rows[1].update(change)
            return "".join(json.dumps(r) + "\n" for r in rows)

        trace = json.loads(chrome_timeline(BUCKETS))

        def chrome(name, **change):  # the known trace with the event `name` changed (a value None: left out)
            events = json.loads(json.dumps(trace))
            e = next(e for e in events if e.get("name") == name)
            e.update(change)
            for k in [k for k, v in change.items() if v is None]:
                del e[k]
            return json.dumps(events)

        base = ["--step-seconds", "0.025", "--clusters", self.clusters, "--cluster", "t", "--skip-steps", "0"]
        cases = [
            (lines(queued=math.nan), "line 2: queued must be finite, got NaN"),
            (lines(queued=math.inf), "line 2: queued must be finite"),
            (lines(queued=-0.001), "line 2: queued must be at least 0"),
            (lines(queued=5.0), "line 2: queued must be at most 1.04"),
            (lines(queued="0.01"), 'line 2: queued must be a number, got "0.01"'),
            (lines(backward_done=1e30), "line 2: backward_done must be at most 86400"),
            (lines(end=1e30), "line 2: end must be at most 1099511627776"),
            (lines(begin=1.5), "line 2: begin must be an integer, got 1.5"),
            (lines(step=True), "line 2: step must be an integer, got true"),
            (lines(statistics_values=-10000000, statistics_queued=0.008), "line 2: statistics_values must be positive"),
            (lines(statistics_values=10, statistics_queued=math.nan), "line 2: statistics_queued must be finite"),
            (lines(begin=0, end=1000000), "buckets 1 (elements 0 to 1000000) and 0 (750000 to 1000000) overlap"),
            (lines(end=750001), "buckets 1 (elements 0 to 750001) and 0 (750000 to 1000000) overlap"),
            (jsonl_timeline(BUCKETS) + "[1, 2]\n", "line 3 is not a bucket line"),
            ('{"step": 0, "bu\n' + jsonl_timeline(BUCKETS) + '{"event": "x"}\n', "line 4 is not a bucket line"),
            (chrome("backward", dur=None), "event 'backward' lacks dur"),
            (chrome("step 7", ts=None), "event 'step 7' lacks ts"),
            (chrome("backward", ts="1008000"), "event 'backward': ts must be a number, got \"1008000\""),
            (chrome("backward", dur=math.nan), "event 'backward': dur must be finite"),
            (chrome("queue bucket 1", ts=1e6 - 1000), "event 'queue bucket 1' of step 7: queued must be at least 0"),
            (chrome("queue bucket 1", args={"step": 7, "bucket": 1, "begin": 0, "end": "x"}),
             "event 'queue bucket 1' of step 7: end must be an integer"),
            (chrome_timeline(BUCKETS)[:300], "is a truncated or invalid Chrome trace (Expecting"),
            ('{"traceEvents": [\n' + chrome_timeline(BUCKETS)[1:200], "is a truncated or invalid Chrome trace"),
            (b'{"step": 0, "\xff": 1}\n', "is not UTF-8 text (byte 13: 0xff)"),
            ("\n  \n", "is empty"),
        ]
        self.refuse_each([(["--timeline", self.write(f"bad{i}.jsonl", text), *base], needle)
                          for i, (text, needle) in enumerate(cases)]
                         + [(["--timeline", os.devnull, *base], "timeline '/dev/null' is not a regular file"),
                            (["--timeline", self.dir.name, *base], "is not a regular file (a directory)")])
        self.expect_usage_error(["--explain", self.write("cut.json", chrome_timeline(BUCKETS)[:300])],
                                "trace '%s' is a truncated or invalid Chrome trace" % os.path.join(self.dir.name, "cut.json"))

    def test_a_line_cut_short_is_skipped_with_a_warning(self):
        """A killed run's cut last line, which hpctrain keeps and appends after (a warning of its
        own): skipped, with one warning, wherever it stands; the rest as without it."""
        whole = jsonl_timeline(BUCKETS, steps=(0, 1))
        rows = whole.splitlines(keepends=True)
        want = self.predict(self.write("t.jsonl", whole), "--gpus", "4")
        for where, text in (("last", whole + rows[0][:30] + "\n"), ("inside", "".join(rows[:2]) + rows[2][:30] + "\n"
                                                                    + "".join(rows[2:])), ("unended", whole + rows[0][:30])):
            with self.subTest(where=where):
                r = self.run_model("--timeline", self.write("cut.jsonl", text), "--step-seconds", "0.025", "--batch",
                                   "32", "--clusters", self.clusters, "--cluster", "t", "--skip-steps", "0", "--json",
                                   "--gpus", "4")
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertEqual(json.loads(r.stdout), want)
                self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)
                self.assertRegex(r.stderr, r"^scaling_model: warning: timeline '.*cut.jsonl': line \d+ cut short")

    def test_bad_metrics(self):
        """A metrics file's events objects, their figures numbers in range; its step events there."""
        config = {"event": "config", "global_batch_size": 32, "world_size": 1}
        step = {"event": "step", "step_seconds": 0.025, "comm_wait_seconds": 0.001}

        def metrics(config=config, **change):
            return json.dumps(config) + "\n" + (json.dumps(dict(step, **change)) + "\n") * 3

        cases = [
            ('{"event": "config", "global_batch_size": 32}\n{"event": "step"}\n', "line 2 lacks step_seconds"),
            (json.dumps(config) + "\n", "has no step events"),
            (metrics() + "[1]\n", "line 5 is not a JSON object"),
            (metrics() + "7\n", "line 5 is not a JSON object"),
            (metrics(step_seconds="abc"), 'line 2: step_seconds must be a number, got "abc"'),
            (metrics(step_seconds=math.nan), "line 2: step_seconds must be finite"),
            (metrics(step_seconds=-1), "line 2: step_seconds must be positive"),
            (metrics(comm_wait_seconds=-1), "line 2: comm_wait_seconds must be at least 0"),
            (metrics(comm_wait_seconds=1), "line 2: comm_wait_seconds must be at most 0.025"),
            (metrics(config={"event": "config", "world_size": 1}), "line 1 lacks global_batch_size"),
            (metrics(config=dict(config, world_size="x")), 'line 1: world_size must be an integer, got "x"'),
            (metrics(config=dict(config, world_size=0)), "line 1: world_size must be positive"),
            (metrics().encode() + b"\xff\n", "is not UTF-8 text"),
        ]
        timeline = self.write("t.jsonl", jsonl_timeline(BUCKETS))
        self.refuse_each([(["--timeline", timeline, "--metrics", self.write(f"m{i}.jsonl", text), "--clusters",
                            self.clusters, "--cluster", "t"], needle) for i, (text, needle) in enumerate(cases)])

    def test_a_sweep_that_cannot_be_fitted(self):
        """--fit-sweep writes a preset: refused where no line of positive bandwidth fits the points, or
        the points are not a sweep's (bytes integers in range, seconds finite and positive)."""
        def sweep(*points, ranks=2):
            return "".join(json.dumps({"ranks": ranks, "bytes": s, "seconds": t}) + "\n" for s, t in points)

        cases = [
            (sweep((4, 2e-6), (4000000, 1e-6)), "2 ranks' times do not grow with the size"),
            (sweep((4, 1e-6), (4000000, 1e-6)), "2 ranks' times do not grow with the size"),
            (sweep((4, 1e-6), (4, 2e-6)), "2 ranks need at least two different sizes"),
            (sweep((4, 1e-6)), "2 ranks need at least two different sizes"),
            (sweep((4, 1e-6), (1e300, 1)), "line 2: bytes must be at most 1099511627776"),
            (sweep((4, 1e-6), ("inf", 1)), 'line 2: bytes must be an integer, got "inf"'),
            (sweep((4, 1e-6), (8, math.nan)), "line 2: seconds must be finite"),
            (sweep((4, 1e-6), (8, 0)), "line 2: seconds must be positive"),
            (sweep((4, 1e-6), (8, 2e-6), ranks=1), "line 1: ranks must be at least 2"),
            (sweep((4, 1e-3), (4000000, 1e-3 + 1e-15)), "(its fit): fits.2.bandwidth_GBps must be at most 1000000"),
            (sweep((4, 1e-6)) + "[1]\n", "line 2 is not a line of bench/allreduce_sweep"),
            (b'{"ranks": 2, "\xff": 1}\n', "is not UTF-8 text"),
        ]
        self.refuse_each([(["--fit-sweep", self.write(f"s{i}.jsonl", text)], needle)
                          for i, (text, needle) in enumerate(cases)])

    def test_no_figure_that_is_not_finite_is_printed(self):
        """The last guard behind the checks: a NaN or infinity is an error, never NaN in the JSON."""
        for bad in (math.nan, math.inf):
            with self.assertRaisesRegex(scaling_model.UsageError, "not finite"):
                scaling_model.as_json({"rows": [{"step_seconds": bad}]})

    def test_a_reader_that_stops_early_ends_it_quietly(self):
        """| head: no BrokenPipeError traceback, the exit code of a program SIGPIPE ends (141)."""
        good = self.write("t.jsonl", jsonl_timeline(BUCKETS))
        sweep = self.write("s.jsonl", "".join(json.dumps({"ranks": 2, "bytes": s, "seconds": 1e-6 + s * 1e-9}) + "\n"
                                              for s in (4, 4096)))
        for args in (["--timeline", good, "--step-seconds", "0.025", "--clusters", self.clusters, "--cluster", "t"],
                     ["--fit-sweep", sweep]):
            with self.subTest(args=args[0]):
                read, write = os.pipe()
                os.close(read)  # the reader gone before the first line
                r = subprocess.run([sys.executable, MODEL, *args], stdout=write, stderr=subprocess.PIPE, text=True,
                                   timeout=60)
                os.close(write)
                self.assertEqual((r.returncode, r.stderr), (141, ""))

    def test_json_nested_too_deeply_is_one_line(self):
        """JSON nested past the decoder's depth in any input file: one line and exit 2 (it was a
        RecursionError traceback, exit 1)."""
        good = self.write("t.jsonl", jsonl_timeline(BUCKETS))
        deep = self.write("deep.json", "[" * 100000 + "]" * 100000 + "\n")
        base = ["--step-seconds", "0.025", "--clusters", self.clusters, "--cluster", "t"]
        self.refuse_each([
            (["--timeline", good, *base[:2], "--cluster", "t", "--clusters", deep], f"clusters file '{deep}' is not JSON"),
            (["--timeline", deep, *base], "nested too deeply"),
            (["--explain", deep], "nested too deeply"),
            (["--fit-sweep", deep], "line 1 is not a line of bench/allreduce_sweep"),
        ])

    def test_results_that_cannot_be_written_are_one_line(self):
        """Standard output on a full disk (/dev/full), or closed: one line naming it and exit 2, not a
        traceback."""
        if not os.path.exists("/dev/full"):
            self.skipTest("no /dev/full here")
        good = self.write("t.jsonl", jsonl_timeline(BUCKETS))
        for extra in ([], ["--json"]):
            with self.subTest(extra=extra), open("/dev/full", "w") as full:
                r = subprocess.run([sys.executable, MODEL, "--timeline", good, "--step-seconds", "0.025", "--clusters",
                                    self.clusters, "--cluster", "t", *extra], stdout=full, stderr=subprocess.PIPE,
                                   text=True, timeout=60)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertEqual(r.stderr, "scaling_model: error: cannot write the results to standard output: "
                                           "No space left on device\n")
        # Started with standard output closed (`>&-`): it was an AttributeError traceback.
        r = subprocess.run(["bash", "-c", 'exec "$0" "$@" >&-', sys.executable, MODEL, "--timeline", good,
                            "--step-seconds", "0.025", "--clusters", self.clusters, "--cluster", "t"],
                           stderr=subprocess.PIPE, text=True, timeout=60)
        self.assertEqual((r.returncode, r.stderr), (2, "scaling_model: error: cannot write the results to standard "
                                                       "output: it is closed\n"))


if __name__ == "__main__":
    unittest.main()

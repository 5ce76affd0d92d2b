"""hpctrain-plot on a real run's metrics file: a run stopped by a signal (checkpoint, exit 75) and
resumed, and one that ran straight through. The charts must be PNGs of the size drawn, and the
restart marked where the run resumed (the tool reports the marks it drew)."""

import json
import os
import struct
import subprocess
import tempfile
import unittest

HPCTRAIN = os.environ["HPCTRAIN"]
PLOT = os.environ["HPCTRAIN_PLOT"]
FASHION_MNIST = os.environ["FASHION_MNIST"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def train(metrics, ckpt, env_extra=None):
    # 512 samples in batches of 32: 16 steps per epoch, 2 epochs.
    env = dict(os.environ)
    env.pop("HPCTRAIN_TEST_SIGNAL_AFTER_STEP", None)
    env.update(env_extra or {})
    args = [HPCTRAIN, "--device", "cpu", "--data-dir", FASHION_MNIST, "--train-samples", "512", "--test-samples",
            "100", "--batch-size", "32", "--epochs", "2", "--threads", "2", "--quiet", "--metrics-file", metrics,
            "--checkpoint-dir", ckpt]
    return subprocess.run(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)


def plot(*args):
    return subprocess.run(["/usr/bin/python3", PLOT, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=120)


def png_size(path):
    """(width, height) from a PNG's IHDR chunk; fails on anything that is not a PNG."""
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == PNG_MAGIC and head[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


class Plot(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="hpctrain-plot-")
        d = cls.tmp.name
        cls.resumed = os.path.join(d, "resumed.jsonl")
        stopped = train(cls.resumed, os.path.join(d, "ck1"), {"HPCTRAIN_TEST_SIGNAL_AFTER_STEP": "20"})
        assert stopped.returncode == 75, stopped.stderr
        finished = train(cls.resumed, os.path.join(d, "ck1"))
        assert finished.returncode == 0, finished.stderr
        cls.straight = os.path.join(d, "straight.jsonl")
        assert train(cls.straight, os.path.join(d, "ck2")).returncode == 0

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def charts(self, prefix):
        return [os.path.join(self.tmp.name, f"{prefix}-{name}.png") for name in ("loss", "accuracy", "throughput")]

    def test_resumed_run_has_its_restart_marked(self):
        with open(self.resumed) as f:
            done = [json.loads(line) for line in f if '"done"' in line]
        self.assertEqual([d["resumed_from_step"] for d in done], [20])  # the run this test meant to make
        p = plot(self.resumed, "--out", self.tmp.name, "--prefix", "resumed")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.splitlines(), self.charts("resumed") + [f"{self.resumed}: restarts marked at steps 20"])
        for chart in self.charts("resumed"):
            self.assertEqual(png_size(chart), (1200, 450), chart)
            self.assertGreater(os.path.getsize(chart), 10000, chart)  # curves drawn, not an empty frame

    def test_straight_run_has_none_and_files_are_compared(self):
        p = plot(self.straight, self.resumed, "--out", self.tmp.name, "--prefix", "both")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.splitlines()[-2:], [f"{self.straight}: no restarts",
                                                     f"{self.resumed}: restarts marked at steps 20"])
        for chart in self.charts("both"):
            self.assertEqual(png_size(chart), (1200, 450), chart)

    def test_bad_input_is_one_line_and_exit_2(self):
        bad = os.path.join(self.tmp.name, "bad.jsonl")
        with open(bad, "w") as f:
            f.write("{not json\n")
        # Lines of another writer: a figure that is no number, or one no axis can hold (tracebacks before).
        with open(self.straight) as f:
            whole = f.read()
        words = os.path.join(self.tmp.name, "words.jsonl")
        with open(words, "w") as f:
            f.write(whole.replace('"elapsed_seconds":', '"elapsed_seconds":"abc","was":', 1))
        huge = os.path.join(self.tmp.name, "huge.jsonl")
        with open(huge, "w") as f:
            f.write(whole + '{"event":"step","step":99,"loss":-1e308}\n')
        for args, message in (([bad], "not a JSON line"), ([os.path.join(self.tmp.name, "none.jsonl")], "cannot read"),
                              ([], "required"), ([self.straight, "--out", bad], "not a directory"),
                              ([words, "--out", self.tmp.name], 'elapsed_seconds is not a number ("abc")'),
                              ([huge, "--out", self.tmp.name], "loss is -1e+308, beyond what a chart can hold")):
            p = plot(*args)
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertEqual(p.stdout, "")
            lines = p.stderr.splitlines()
            self.assertEqual(len(lines), 1, p.stderr)
            self.assertTrue(lines[0].startswith("hpctrain-plot: error: ") and message in lines[0], lines[0])

    def test_missing_out_is_made(self):
        """--out charts/ that does not exist yet is made, parents too (as mkdir -p); bad input makes
        none, and one that cannot be made is one line."""
        out = os.path.join(self.tmp.name, "new", "charts") + "/"
        p = plot(self.straight, "--out", out)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.splitlines()[:3], [os.path.join(out, f"metrics-{name}.png")
                                                     for name in ("loss", "accuracy", "throughput")])
        for name in ("loss", "accuracy", "throughput"):
            self.assertEqual(png_size(os.path.join(out, f"metrics-{name}.png")), (1200, 450))
        none = os.path.join(self.tmp.name, "not-made")
        p = plot(os.path.join(self.tmp.name, "none.jsonl"), "--out", none)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertFalse(os.path.exists(none), "a refused plot made its --out")
        a_file = os.path.join(self.tmp.name, "a-file")
        with open(a_file, "w") as f:
            f.write("x")
        p = plot(self.straight, "--out", os.path.join(a_file, "charts"))
        self.assertEqual((p.returncode, p.stdout), (1, ""), p.stderr)
        self.assertEqual(p.stderr.splitlines(), [f"hpctrain-plot: error: --out {a_file}/charts cannot be made: "
                                                 "Not a directory"])
        p = plot(self.straight, "--out", "")
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertEqual(p.stderr.splitlines(), ["hpctrain-plot: error: --out is an empty path (an unset variable?)"])

    def test_cut_lines_are_skipped_bad_lines_refused(self):
        """A run killed while writing a line leaves it cut: the last line, or one that the next run's
        lines follow (hpctrain starts them on a new line). Those are skipped with a warning; a bad
        line in the middle (the old hpctrain's next event glued onto a cut one) is still refused."""
        with open(self.straight) as f:
            whole = f.read()
        cut = os.path.join(self.tmp.name, "cut.jsonl")
        with open(cut, "w") as f:
            f.write(whole + '{"event":"step","step":3,"lo')
        count = len(whole.splitlines()) + 1
        for resumed_after in (False, True):
            if resumed_after:  # hpctrain appends to it: the cut line stays, the events start after it
                assert train(cut, os.path.join(self.tmp.name, "ck-cut")).returncode == 0
                with open(cut) as f:
                    self.assertTrue(f.read().startswith(whole + '{"event":"step","step":3,"lo\n{"event":'))
            p = plot(cut, "--out", self.tmp.name, "--prefix", "cut")
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertEqual(p.stderr, f"hpctrain-plot: warning: {cut}:{count}: a line cut short (a run killed while "
                                       "writing it?), skipped\n")
        zeros = os.path.join(self.tmp.name, "zeros.jsonl")  # a machine that crashed: its last block unwritten
        with open(zeros, "w") as f:
            f.write(whole + "\0" * 8)
        p = plot(zeros, "--out", self.tmp.name, "--prefix", "zeros")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn(f"{zeros}:{count}: a line cut short", p.stderr)
        glued = os.path.join(self.tmp.name, "glued.jsonl")
        with open(glued, "w") as f:
            f.write(whole + '{"event":"step","step":3,"lo{"event":"epoch","step":4}\n' + whole)
        p = plot(glued, "--out", self.tmp.name, "--prefix", "glued")
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertEqual(p.stderr.splitlines(), [f"hpctrain-plot: error: {glued}:{count}: not a JSON line "
                                                 "(Expecting ':' delimiter)"])


if __name__ == "__main__":
    unittest.main()

"""hpctrain-plot on a real run's metrics file: a run stopped by a signal (checkpoint, exit 75) and
resumed, and one that ran straight through. The charts must be PNGs of the size drawn, and the
restart marked where the run resumed (the tool reports the marks it drew)."""

import json
import re
import os
import resource
import signal
import struct
import subprocess
import tempfile
import time
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
        # Nested past what json decodes: its RecursionError was a traceback, exit 1.
        nested = os.path.join(self.tmp.name, "nested.jsonl")
        with open(nested, "w") as f:
            f.write('{"event":"step","step":1,"loss":1,"x":' + "[" * 1000 + "]" * 1000 + "}\n")
        for args, message in (([bad], "not a JSON line"), ([os.path.join(self.tmp.name, "none.jsonl")], "cannot read"),
                              ([], "required"), ([self.straight, "--out", bad], "not a directory"),
                              ([words, "--out", self.tmp.name], 'elapsed_seconds is not a number ("abc")'),
                              ([huge, "--out", self.tmp.name], "loss is -1e+308, beyond what a chart can hold"),
                              ([nested, "--out", self.tmp.name], f"{nested}:1: not a JSON line (nested too deeply)")):
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

    def test_under_umask_000_nothing_it_makes_is_writable_by_others(self):
        """Under umask 000 --out (and the folders above it) was 0777 and each chart 0666: any user
        could replace a run's charts. Now neither is others' to write."""
        top = os.path.join(self.tmp.name, "umask000")
        before = os.umask(0)
        try:
            p = plot(self.straight, "--out", os.path.join(top, "charts"))
        finally:
            os.umask(before)
        self.assertEqual(p.returncode, 0, p.stderr)
        made = [top] + [os.path.join(d, n) for d, dirs, files in os.walk(top) for n in dirs + files]
        self.assertEqual(len(made), 5, made)
        for path in made:
            self.assertEqual(os.lstat(path).st_mode & 0o002, 0, f"{path} is writable by others")

    def test_version_is_the_projects(self):
        """--version as the suite's other programs say it, the project's version, before the required
        METRICS.jsonl is asked for (it said "the following arguments are required", exit 2)."""
        with open(os.path.join(os.path.dirname(PLOT), os.pardir, "CMakeLists.txt"), encoding="utf-8") as f:
            project = re.search(r"^project\(hpctrain VERSION (\S+)", f.read(), re.MULTILINE).group(1)
        said = plot("--version")
        self.assertEqual((said.returncode, said.stdout, said.stderr), (0, f"hpctrain-plot {project}\n", ""))

    def test_output_that_cannot_be_written_is_an_error(self):
        """`> file` on a full disk (/dev/full): --help ended 0 with nothing written (argparse passes
        over the failed write), --version 1 with "error: : No space left on device", and the charts'
        paths ended 120 with Python's "Exception ignored" block. One line, exit 2."""
        out = os.path.join(self.tmp.name, "full-stdout")
        for args in (["--help"], ["--version"], [self.straight, "--out", out]):
            with self.subTest(args=args), open("/dev/full", "w") as full:
                p = subprocess.run(["/usr/bin/python3", PLOT, *args], stdout=full, stderr=subprocess.PIPE, text=True,
                                   timeout=120)
                self.assertEqual((p.returncode, p.stderr.splitlines()),
                                 (2, ["hpctrain-plot: error: cannot write the results to standard output: "
                                      "No space left on device"]))
        # A reader gone (a pipe's read end closed) read what it wanted of --help: exit 0, nothing said.
        r, w = os.pipe()
        os.close(r)
        p = subprocess.run(["/usr/bin/python3", PLOT, "--help"], stdout=w, stderr=subprocess.PIPE, text=True,
                           timeout=120)
        os.close(w)
        self.assertEqual((p.returncode, p.stderr), (0, ""))

    def test_without_matplotlib_is_one_line_and_makes_nothing(self):
        """matplotlib is only Recommended by the packages (apt --no-install-recommends leaves it out),
        and the first python3 on PATH may lack it: one line naming the package, exit 1, no --out
        made (a traceback from inside the first chart before). python3 -S: no dist-packages."""
        out = os.path.join(self.tmp.name, "no-matplotlib")
        p = subprocess.run(["/usr/bin/python3", "-S", PLOT, self.straight, "--out", out], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=120)
        self.assertEqual((p.returncode, p.stdout), (1, ""), p.stderr)
        lines = p.stderr.splitlines()
        self.assertEqual(len(lines), 1, p.stderr)
        self.assertTrue(lines[0].startswith("hpctrain-plot: error: cannot draw charts without matplotlib")
                        and lines[0].endswith("apt-get install python3-matplotlib"), lines[0])
        self.assertFalse(os.path.exists(out), "a plot without matplotlib made its --out")

    def test_chart_names_that_are_taken_are_refused_before_writing(self):
        """A chart's name that is a directory (the chart was written to NAME.tmp, then the rename
        failed: exit 1, the .tmp left behind and named) or the input file itself (overwritten) is
        refused, exit 2, before anything is written."""
        out = os.path.join(self.tmp.name, "taken")
        os.makedirs(os.path.join(out, "metrics-loss.png"))
        p = plot(self.straight, "--out", out)
        self.assertEqual((p.returncode, p.stdout), (2, ""), p.stderr)
        self.assertEqual(p.stderr.splitlines(), [f"hpctrain-plot: error: {out}/metrics-loss.png is a directory: the "
                                                 "chart cannot take its name (another --out or --prefix?)"])
        self.assertEqual(os.listdir(out), ["metrics-loss.png"])
        with open(self.straight) as f:
            whole = f.read()
        own = os.path.join(out, "own")
        os.makedirs(own)
        for name in ("metrics-accuracy.png", "link.jsonl"):
            with self.subTest(input=name):
                given = os.path.join(own, name)
                with open(os.path.join(own, "metrics-accuracy.png"), "w") as f:
                    f.write(whole)
                if name == "link.jsonl":  # the same file by another name
                    os.symlink("metrics-accuracy.png", given)
                p = plot(given, "--out", os.path.join(own, "..", "own"))
                self.assertEqual((p.returncode, p.stdout), (2, ""), p.stderr)
                self.assertEqual(p.stderr.splitlines(), [f"hpctrain-plot: error: {own}/../own/metrics-accuracy.png is "
                                                         f"the input file {given}: the chart would overwrite it "
                                                         "(another --out or --prefix?)"])
                with open(os.path.join(own, "metrics-accuracy.png")) as f:
                    self.assertEqual(f.read(), whole)
                self.assertEqual(sorted(os.listdir(own)), sorted({"metrics-accuracy.png", name}))

    def test_failed_write_names_the_chart_and_leaves_no_temporary(self):
        """A chart that cannot be written (here a full disk, as the tool sees it: no file may grow
        past 10 kB) is exit 1, names the chart, not its temporary, and leaves neither behind."""
        out = os.path.join(self.tmp.name, "full")
        os.makedirs(out)

        def small_files():
            resource.setrlimit(resource.RLIMIT_FSIZE, (10000, 10000))
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        p = subprocess.run(["/usr/bin/python3", PLOT, self.straight, "--out", out], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=120, preexec_fn=small_files)
        self.assertEqual((p.returncode, p.stdout), (1, ""), p.stderr)
        self.assertEqual(p.stderr.splitlines(), [f"hpctrain-plot: error: {out}/metrics-loss.png: File too large"])
        self.assertEqual(os.listdir(out), [])

    def test_interrupt_is_one_line_and_leaves_no_temporary(self):
        """Ctrl-C (a KeyboardInterrupt traceback before) while the modules load, and while a
        chart is written (its temporary left behind before): status 130, one line, no temporary.
        The signal goes as the script's own imports begin (seen in -X importtime's lines: earlier,
        while the interpreter starts, no code of the script runs), once a temporary exists, and
        while tempfile.mkstemp has made the temporary but not yet returned its name (held there
        by a slowed os.open; a CI run once caught that moment by chance, and left the temporary)."""
        slowed_open = ("import os, runpy, sys, time\n"
                       "real_open = os.open\n"
                       "def slowed_open(path, *args, **kwargs):\n"
                       "    fd = real_open(path, *args, **kwargs)\n"
                       "    if str(path).endswith('.tmp'):\n"
                       "        time.sleep(3)\n"
                       "    return fd\n"
                       "os.open = slowed_open\n"
                       "sys.argv = sys.argv[1:]\n"
                       "runpy.run_path(sys.argv[0], run_name='__main__')\n")
        for when in ("importing", "creating", "writing"):
            with self.subTest(when=when):
                out = os.path.join(self.tmp.name, f"interrupted-{when}")
                python = {"importing": ["-X", "importtime"], "creating": ["-c", slowed_open], "writing": []}[when]
                job = subprocess.Popen(["/usr/bin/python3", *python, PLOT, self.straight, "--out", out],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                seen = []
                if when == "importing":
                    for line in job.stderr:
                        seen.append(line)
                        if line.rstrip().endswith("| argparse"):  # its first import after its own hook
                            break
                else:
                    deadline = time.monotonic() + 60
                    while not (os.path.isdir(out) and any(n.endswith(".tmp") for n in os.listdir(out))):
                        self.assertIsNone(job.poll(), "the charts were written before a temporary was seen")
                        self.assertLess(time.monotonic(), deadline, "no temporary appeared")
                        time.sleep(0.001)
                job.send_signal(signal.SIGINT)
                _, err = job.communicate(timeout=60)
                err = "".join(line for line in seen + err.splitlines(True) if not line.startswith("import time:"))
                self.assertEqual(job.returncode, 130, err)
                self.assertEqual(err.splitlines(), ["hpctrain-plot: interrupted"])
                self.assertEqual([n for n in os.listdir(out) if not n.endswith("-loss.png")] if os.path.isdir(out)
                                 else [], [], "an interrupted plot left a temporary or a chart it was writing")

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

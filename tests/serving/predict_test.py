"""hpctrain predict on images this test writes (PNG and JPEG, several sizes, grey and colour, files
and directories), against hpctrain evaluate on the same samples; every kind of bad input (a file
that is not an image, a truncated JPEG or PNG, a path that cannot be read, a checkpoint of another
model or a corrupt one) is one error line and exit code 2, or with --skip-bad a warning and the rest
classified. hpctrain export: a corrupt checkpoint is refused, an output in a missing directory or
one that exists is refused, an output (or evaluate's metrics file) that is the checkpoint read, by
any spelling or link, is refused even with --force, and --force replaces a file only by the rename of a complete one (a
stop in the middle leaves the old file byte for byte). Under mpirun the batches are shared among
the ranks and the output is the same as one rank's."""

import gzip
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import tempfile
import threading
import time
import unittest
import zlib

import cv2
import numpy as np

HPCTRAIN = os.environ["HPCTRAIN"]
HPCDATA_PACK = os.environ["HPCDATA_PACK"]
MPIEXEC = os.environ.get("HPCTRAIN_MPIEXEC", "mpirun")
FASHION_MNIST = os.environ.get("FASHION_MNIST", "/usr/share/datasets/fashion-mnist")
FIRST = 64  # the test samples compared with evaluate
SMOOTHING = 0.1  # the checkpoint's --label-smoothing: evaluate's test loss is the training criterion
CPU = ["--device", "cpu", "--threads", "2"]


def run(*args, env=None):
    p = subprocess.run([HPCTRAIN, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120,
                       env=env)
    # Warnings in a file (this pipe) start with the time; the messages are what is compared.
    err = re.sub(r"(?m)^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}\.[0-9]{3}Z ", "", p.stderr)
    return p.returncode, p.stdout, err


def ok(*args):
    code, out, err = run(*args)
    assert code == 0, f"hpctrain {' '.join(args)} exited {code}: {err}"
    return out


def logits_of(out):
    """path -> logits of predict --json --logits's lines."""
    return {r["path"]: np.array(r["logits"], dtype=np.float64) for r in map(json.loads, out.splitlines())}


def rewrite_meta(src, dst, change):
    """A copy of checkpoint src whose meta section (kind 1) is change(text), its CRC-32 recomputed:
    a valid file that says something else."""
    with open(src, "rb") as f:
        data = f.read()
    out, pos = bytearray(data[:12]), 12  # magic and format version
    while pos < len(data):
        kind, size, _ = struct.unpack_from("<IQI", data, pos)
        payload = data[pos + 16:pos + 16 + size]
        if kind == 1:
            payload = change(payload.decode()).encode()
        out += struct.pack("<IQI", kind, len(payload), zlib.crc32(payload)) + payload
        pos += 16 + size
    with open(dst, "wb") as f:
        f.write(out)


def without_class_names(meta):
    """The meta section as a checkpoint written before class names were recorded has it."""
    return "".join(line for line in meta.splitlines(True) if not line.startswith(("class_names=", "classes_digest=")))


def pack(out, classes, tmp):
    """Packs train and val splits of small JPEGs into out, a folder per class (labels in name order)."""
    for split in ("train", "val"):
        src = os.path.join(tmp, f"src-{os.path.basename(out)}-{split}")
        for c, name in enumerate(classes):
            os.makedirs(os.path.join(src, name))
            for i in range(4):
                cv2.imwrite(os.path.join(src, name, f"{i}.jpg"), np.full((12, 12, 3), 40 + 90 * c + 7 * i, np.uint8))
        p = subprocess.run([HPCDATA_PACK, src, out, "--split", split, "--quiet"], stderr=subprocess.PIPE, text=True,
                           timeout=120)
        assert p.returncode == 0, p.stderr


class Serving(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="hpctrain-predict-")
        cls.ck = os.path.join(cls.tmp, "ck")
        ok("--model", "cnn", "--train-samples", "512", "--epochs", "1", "--test-samples", str(FIRST),
           "--label-smoothing", str(SMOOTHING), "--checkpoint-dir", cls.ck, "--quiet", *CPU)
        cls.ckpt = os.path.join(cls.ck, sorted(n for n in os.listdir(cls.ck) if n.endswith(".hpck"))[-1])
        with gzip.open(os.path.join(FASHION_MNIST, "t10k-images-idx3-ubyte.gz")) as f:
            cls.images = np.frombuffer(f.read()[16:16 + FIRST * 784], np.uint8).reshape(FIRST, 28, 28)
        with gzip.open(os.path.join(FASHION_MNIST, "t10k-labels-idx1-ubyte.gz")) as f:
            cls.labels = np.frombuffer(f.read()[8:8 + FIRST], np.uint8)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, True)

    def setUp(self):
        self.dir = tempfile.mkdtemp(dir=self.tmp)

    def write(self, name, pixels, *params):
        path = os.path.join(self.dir, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.assertTrue(cv2.imwrite(path, pixels, list(params)))
        return path

    def predict(self, *args):
        return ok("predict", "--checkpoint", self.ck, "--json", "--logits", *CPU, *args)

    def assert_refused(self, args, message):
        code, out, err = run(*args)
        self.assertEqual(code, 2, err)
        lines = err.strip().splitlines()
        self.assertEqual(len(lines), 1, err)
        self.assertIn("error:", lines[0])
        self.assertIn(message, lines[0])
        return out

    # ---- predict agrees with evaluate ----------------------------------------------------------

    def test_agrees_with_evaluate_on_the_same_samples(self):
        for i, image in enumerate(self.images):
            self.write(f"test/{i:03d}.png", image)
        got = logits_of(self.predict("--top-k", "10", os.path.join(self.dir, "test")))
        z = np.stack([got[os.path.join(self.dir, "test", f"{i:03d}.png")] for i in range(FIRST)])
        log_p = z - z.max(axis=1, keepdims=True)
        log_p -= np.log(np.exp(log_p).sum(axis=1, keepdims=True))
        metrics = os.path.join(self.dir, "evaluate.jsonl")
        ok("evaluate", "--checkpoint", self.ck, "--test-samples", str(FIRST), "--metrics-file", metrics,
           "--threads", "2")
        with open(metrics) as f:
            evaluated = json.loads(f.readline())
        self.assertEqual(int((z.argmax(axis=1) == self.labels).sum()), round(evaluated["test_accuracy"] * FIRST))
        # Cross-entropy against the smoothed target (1 - e) * onehot + e / K, as evaluate computes it.
        loss = -((1 - SMOOTHING) * log_p[np.arange(FIRST), self.labels] + SMOOTHING * log_p.mean(axis=1)).mean()
        self.assertAlmostEqual(loss / evaluated["test_loss"], 1.0, delta=1e-6)

    def test_sizes_colours_and_formats_frame_as_evaluation(self):
        """Each variant of a test image that holds the same pixels once framed (grey or colour, PNG
        with alpha, 2x and 3x larger, not square around the same square) gives the reference's
        logits; a colour image gives its luma's; an image smaller than the model's input is enlarged
        bilinearly; a JPEG gives the logits of its decoded pixels."""
        image = self.images[3]
        ref = self.write("ref.png", image)
        rgb = np.repeat(image[..., None], 3, axis=2)
        same = [self.write("colour.png", rgb),
                self.write("alpha.png", np.dstack([rgb, np.full_like(image, 255)])),
                # 16-bit samples are sRGB as 8-bit ones are (libpng took them for linear light:
                # a grey of 128 read as 186)
                self.write("sixteen-bit.png", image.astype(np.uint16) * 257),
                self.write("sixteen-bit-colour.png", rgb.astype(np.uint16) * 257),
                self.write("twice.png", np.kron(image, np.ones((2, 2), np.uint8))),
                self.write("thrice-colour.png", np.kron(rgb, np.ones((3, 3, 1), np.uint8))),
                self.write("tall.png", np.pad(image, ((6, 6), (0, 0)))),
                self.write("wide-colour.png", np.pad(rgb, ((0, 0), (10, 10), (0, 0))))]
        # A colour image against its BT.601 luma, which a grey model sees (README).
        colour = np.dstack([image, image // 2, 255 - image]).astype(np.uint32)  # R, G, B
        luma = (19595 * colour[..., 0] + 38470 * colour[..., 1] + 7471 * colour[..., 2] + 32768) >> 16
        luma_ref = self.write("luma-ref.png", luma.astype(np.uint8))
        colour_path = self.write("rgb.png", colour[..., ::-1].astype(np.uint8))  # OpenCV writes BGR
        small = image[4:24, 4:24]
        small_ref = self.write("small-ref.png", self.bilinear(small, 28))
        small_path = self.write("small.png", small)
        jpegs = [self.write("grey.jpg", image, cv2.IMWRITE_JPEG_QUALITY, 95),
                 self.write("colour.jpg", np.dstack([image, image // 2, 255 - image]), cv2.IMWRITE_JPEG_QUALITY, 90)]
        decoded = [self.write(f"decoded-{i}.png", cv2.imread(p)) for i, p in enumerate(jpegs)]
        got = logits_of(self.predict("--batch-size", "16", self.dir))
        for path in same:
            np.testing.assert_allclose(got[path], got[ref], rtol=1e-6, atol=1e-6, err_msg=path)
        np.testing.assert_allclose(got[small_path], got[small_ref], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(got[colour_path], got[luma_ref], rtol=1e-6, atol=1e-6)
        for jpeg, png in zip(jpegs, decoded):
            np.testing.assert_allclose(got[jpeg], got[png], rtol=1e-6, atol=1e-6, err_msg=jpeg)

    @staticmethod
    def bilinear(grey, size):
        """hpctrain's enlargement (data::centre_view of the whole square), in numpy."""
        n = grey.shape[0]
        o = np.arange(size, dtype=np.float64)
        f = np.clip((o + 0.5) * (n / size) - 0.5, 0.0, n - 1)
        i0 = f.astype(np.int64)
        i1, w = np.minimum(i0 + 1, n - 1), f - i0
        p = grey.astype(np.float64)
        wy, wx = w[:, None], w[None, :]
        v = ((1 - wy) * ((1 - wx) * p[i0][:, i0] + wx * p[i0][:, i1])
             + wy * ((1 - wx) * p[i1][:, i0] + wx * p[i1][:, i1]))
        return np.clip(v + 0.5, 0.0, 255.0).astype(np.uint8)

    def test_directories_are_walked_in_order_and_text_names_the_classes(self):
        paths = [self.write(name, self.images[i]) for i, name in
                 enumerate(["b.png", "a/z.JPG", "a/deeper/y.jpeg", "a/x.png"])]
        with open(os.path.join(self.dir, "a", "notes.txt"), "w") as f:
            f.write("not an image, and not named as one: left alone\n")
        out = ok("predict", "--checkpoint", self.ckpt, *CPU, "--top-k", "3", self.dir, paths[0])
        lines = out.splitlines()
        expected = sorted(paths) + [paths[0]]
        self.assertEqual([line.split(": ")[0] for line in lines], expected)
        names = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                 "Ankle boot"]
        for line in lines:
            top = line.split(": ", 1)[1].split(", ")
            self.assertEqual(len(top), 3, line)
            probabilities = [float(t.rsplit(" ", 1)[1]) for t in top]
            self.assertEqual(probabilities, sorted(probabilities, reverse=True), line)
            self.assertTrue(all(t.rsplit(" ", 1)[0] in names for t in top), line)
        record = json.loads(self.predict(paths[0]).splitlines()[0])
        self.assertEqual([k for k in record], ["path", "top", "logits"])
        self.assertEqual(len(record["top"]), 5)
        self.assertAlmostEqual(sum(np.exp(np.array(record["logits"]) - max(record["logits"]))
                                   / np.exp(np.array(record["logits"]) - max(record["logits"])).sum()), 1.0)

    def test_text_escapes_tell_a_newline_from_a_backslash_n(self):
        # The text form writes control characters as escapes (\n, \t, \xNN) and doubles a
        # backslash, so a file named with a newline and one named with a backslash and an n print
        # as two different lines that each give back their own name; JSON carries the names as they are.
        paths = [self.write(name, self.images[0]) for name in ["a\nb.png", "a\\nb.png", "tab\there.png"]]
        lines = ok("predict", "--checkpoint", self.ckpt, *CPU, "--top-k", "1", *paths).splitlines()
        self.assertEqual(len(lines), 3, lines)
        shown = [line.split(": ")[0] for line in lines]
        self.assertEqual(shown, [p.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t") for p in paths])
        self.assertEqual(len(set(shown)), 3, shown)
        records = [json.loads(line) for line in self.predict(*paths).splitlines()]
        self.assertEqual([r["path"] for r in records], paths)

    def test_json_tells_apart_paths_that_are_not_utf8(self):
        """Two names that differ only in a byte that is not UTF-8 both read "\ufffd.png" in JSON's
        "path": "path_escaped" gives each as the text form does, so a script can tell them apart."""
        with open(self.write("good.png", self.images[0]), "rb") as f:
            png = f.read()
        names = [os.path.join(os.fsencode(self.dir), n) for n in (b"\xff.png", b"\xfe.png")]
        for name in names:
            with open(name, "wb") as f:
                f.write(png)
        records = [json.loads(line) for line in self.predict(*map(os.fsdecode, names)).splitlines()]
        self.assertEqual([r["path"] for r in records], [self.dir + "/\ufffd.png"] * 2)
        self.assertEqual([r["path_escaped"] for r in records], [self.dir + "/\\xff.png", self.dir + "/\\xfe.png"])
        self.assertEqual(list(records[0]), ["path", "path_escaped", "top", "logits"])

    def test_ranks_share_the_batches_and_print_in_order(self):
        paths = [self.write(f"{i:02d}.png", self.images[i]) for i in range(10)]
        one = self.predict("--batch-size", "3", self.dir)
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMPI_MCA_btl_vader_backing_directory="/tmp")
        p = subprocess.run([MPIEXEC, "--oversubscribe", "--bind-to", "none", "-np", "2", HPCTRAIN, "predict",
                            "--checkpoint", self.ck, "--json", "--logits", "--device", "cpu", "--threads", "1",
                            "--batch-size", "3", self.dir], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=120, env=env)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual([json.loads(x)["path"] for x in p.stdout.splitlines()], paths)
        for a, b in zip(map(json.loads, one.splitlines()), map(json.loads, p.stdout.splitlines())):
            np.testing.assert_allclose(a["logits"], b["logits"], rtol=1e-6, atol=1e-6)
        self.assertIn("10 image(s)", p.stderr)
        self.assertIn("2 rank(s)", p.stderr)

    # ---- bad input -------------------------------------------------------------------------------

    def bad_files(self):
        """name -> (path, what the error says)."""
        good = self.write("good.png", self.images[0])
        with open(good, "rb") as f:
            png = f.read()
        jpeg_path = self.write("whole.jpg", self.images[1], cv2.IMWRITE_JPEG_QUALITY, 90)
        with open(jpeg_path, "rb") as f:
            jpeg = f.read()
        os.remove(jpeg_path)
        files = {}
        for name, data, says in [("text.png", b"hello, not an image\n", "is not a PNG or JPEG image"),
                                 ("truncated.jpg", jpeg[:len(jpeg) // 2], "is a damaged JPEG image"),
                                 ("truncated.png", png[:len(png) // 2], "is a damaged PNG image"),
                                 ("empty.jpeg", b"", "is empty")]:
            path = os.path.join(self.dir, name)
            with open(path, "wb") as f:
                f.write(data)
            files[name] = (path, f"{path} {says}")
        missing = os.path.join(self.dir, "missing.png")
        files["missing"] = (missing, f"cannot read image {missing}: No such file or directory")
        dangling = os.path.join(self.dir, "dangling.png")
        os.symlink(os.path.join(self.dir, "nowhere"), dangling)
        files["dangling"] = (dangling, f"cannot read image {dangling}: No such file or directory")
        return good, files

    def test_each_bad_image_is_one_error_line_and_exit_2(self):
        good, files = self.bad_files()
        for name, (path, says) in files.items():
            with self.subTest(name):
                out = self.assert_refused(["predict", "--checkpoint", self.ck, *CPU, good, path], says)
                self.assertEqual(out, "", "nothing is printed for a refused batch")
        empty = os.path.join(self.dir, "empty-dir")
        os.mkdir(empty)
        self.assert_refused(["predict", "--checkpoint", self.ck, *CPU, empty], f"no PNG or JPEG images")

    def test_a_huge_claim_in_a_small_png_costs_no_memory(self):
        """A valid PNG whose header claims 16384x16384 pixels that its 1 kB cannot hold: refused as
        damaged before its pixels are allocated. predict allocated them first (805 MB, zeroed, in
        each decoding thread), and a directory of such files could take a node's memory."""
        good = self.write("good.png", self.images[0])
        with open(good, "rb") as f:
            png = bytearray(f.read())
        self.assertEqual(png[12:16], b"IHDR")
        png[16:24] = struct.pack(">II", 16384, 16384)
        png[29:33] = struct.pack(">I", zlib.crc32(bytes(png[12:29])))
        path = os.path.join(self.dir, "huge.png")
        with open(path, "wb") as f:
            f.write(png)
        with tempfile.TemporaryFile("w+") as err:
            p = subprocess.Popen([HPCTRAIN, "predict", "--checkpoint", self.ck, *CPU, path],
                                 stdout=subprocess.DEVNULL, stderr=err, text=True)
            timer = threading.Timer(120, p.kill)
            timer.start()
            _, status, usage = os.wait4(p.pid, 0)  # (not p.wait(): its peak memory comes with it)
            p.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
            timer.cancel()
            err.seek(0)
            said = err.read()
        self.assertEqual(os.waitstatus_to_exitcode(status), 2, said)
        self.assertLess(usage.ru_maxrss, 300 * 1024, "KiB at the peak")
        self.assertIn(f"{path} is a damaged PNG image: its 16384x16384 pixels cannot come from {len(png)} bytes",
                      said)

    def test_results_that_cannot_be_written_are_an_error(self):
        """A full disk under stdout: predict went on to its summary and exit 0 as if every line
        had been written."""
        good = self.write("good.png", self.images[0])
        with open("/dev/full", "w") as full:
            p = subprocess.run([HPCTRAIN, "predict", "--checkpoint", self.ck, *CPU, good], stdout=full,
                               stderr=subprocess.PIPE, text=True, timeout=120)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertEqual(p.stderr.strip().splitlines(),
                         ["hpctrain: error: cannot write the results to standard output: No space left on device"])

    def test_an_evaluation_that_cannot_write_its_metrics_line_is_an_error(self):
        """evaluate's --metrics-file line is its result: a full disk was a warning ("training goes
        on") and exit 0, and a script found an empty file."""
        code, out, err = run("evaluate", "--checkpoint", self.ck, "--threads", "2", "--test-samples", "8",
                             "--metrics-file", "/dev/full")
        self.assertEqual(code, 2, err)
        self.assertIn("test accuracy", out)
        self.assertEqual(err.strip().splitlines(),
                         ["hpctrain: error: cannot write --metrics-file /dev/full: No space left on device"])

    def test_an_image_too_big_for_the_memory_left_is_its_own_problem(self):
        """A 260 KB PNG of 16384 x 16384 grey zeros takes 1.6 GB to decode and frame: out of
        memory was "internal error: ... std::bad_alloc", exit 1, which --skip-bad could not pass
        by. Under a 1 GB address-space limit (hpctrain needs about 0.4 GB for a small image)."""
        side = 16384
        bomb = os.path.join(self.dir, "bomb.png")
        squeeze, row = zlib.compressobj(9), bytes(side + 1)  # filter byte 0 and a row of zeros

        def chunk(kind, data):
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

        idat = b"".join(squeeze.compress(row * 1024) for _ in range(side // 1024)) + squeeze.flush()
        with open(bomb, "wb") as f:
            f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0))
                    + chunk(b"IDAT", idat) + chunk(b"IEND", b""))
        good = self.write("good.png", self.images[0])

        def limited():
            import resource
            resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

        def predict(*args):
            return subprocess.run([HPCTRAIN, "predict", "--checkpoint", self.ck, *CPU, *args], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, timeout=120, preexec_fn=limited)

        p = predict(good, bomb)
        self.assertEqual((p.returncode, p.stdout), (2, ""), p.stderr)
        self.assertEqual(p.stderr.strip().splitlines(),
                         [f"hpctrain: error: image {bomb} does not fit in the memory left to decode it "
                          "(fewer --threads decode fewer at once)"])
        p = predict("--skip-bad", good, bomb)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(len(p.stdout.splitlines()), 1, p.stdout)

    def test_a_walked_directory_follows_links_and_names_a_dangling_one(self):
        """A link to a directory is walked; an entry named as an image that cannot be read (a
        dangling link) is refused as a path given alone is (both were passed by in silence)."""
        walked = os.path.join(self.dir, "walked")
        good = self.write("walked/good.png", self.images[0])
        linked = self.write("elsewhere/x.png", self.images[1])
        os.symlink(os.path.join(self.dir, "elsewhere"), os.path.join(walked, "linked"))
        dangling = os.path.join(walked, "dangling.png")
        os.symlink(os.path.join(self.dir, "nowhere"), dangling)
        self.assert_refused(["predict", "--checkpoint", self.ck, *CPU, walked],
                            f"cannot read image {dangling}: No such file or directory")
        os.remove(dangling)
        out = ok("predict", "--checkpoint", self.ck, *CPU, "--json", walked)
        self.assertEqual([json.loads(x)["path"] for x in out.splitlines()],
                         [good, os.path.join(walked, "linked", "x.png")])
        self.assertTrue(os.path.exists(linked))
        # A link back up listed every image again at each turn, 40 times over.
        back = os.path.join(self.dir, "elsewhere", "back")
        os.symlink(walked, back)
        self.assert_refused(["predict", "--checkpoint", self.ck, *CPU, walked],
                            f"{os.path.join(walked, 'linked', 'back')} leads back to {walked}, a folder it lies in")

    def test_a_device_it_does_not_know_is_refused_with_the_choices(self):
        good, _ = self.bad_files()
        self.assert_refused(["predict", "--checkpoint", self.ck, "--device", "tpu", good],
                            "unknown --device 'tpu' (choose auto, cpu or cuda)")
        self.assert_refused(["predict", "--checkpoint", self.ck, "--device", "", good], "--device is empty")

    def test_more_classes_than_the_model_has_is_refused(self):
        """--top-k 11 of a 10-class model printed 10 without a word; 10 prints them all, and the
        default, 5, is no error on a model of fewer (a folder of two classes, packed)."""
        good, _ = self.bad_files()
        self.assert_refused(["predict", "--checkpoint", self.ck, "--top-k", "11", good],
                            "--top-k 11 is more than the 10 classes of the checkpoint's model")
        self.assertEqual(len(ok("predict", "--checkpoint", self.ck, *CPU, "--top-k", "10", good).split(", ")), 10)

    def test_an_unreadable_image_says_why(self):
        """Permission denied is not "does not exist". As root (CI), hpctrain runs without the
        capabilities that let root past permission bits, so that the test runs everywhere."""
        good = self.write("good.png", self.images[0])
        locked = self.write("locked.png", self.images[1])
        os.chmod(locked, 0)
        prefix = ["/usr/bin/setpriv", "--inh-caps=-dac_override,-dac_read_search",
                  "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
        p = subprocess.run(prefix + [HPCTRAIN, "predict", "--checkpoint", self.ck, *CPU, good, locked],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
        self.assertEqual((p.returncode, p.stdout), (2, ""), p.stderr)
        self.assertEqual(p.stderr.strip().splitlines(),
                         [f"hpctrain: error: cannot read image {locked}: Permission denied"])

    def test_skip_bad_warns_and_classifies_the_rest(self):
        good, files = self.bad_files()
        args = [good] + [path for path, _ in files.values()] + [good]
        code, out, err = run("predict", "--checkpoint", self.ck, *CPU, "--skip-bad", "--json", *args)
        self.assertEqual(code, 0, err)
        self.assertEqual([json.loads(x)["path"] for x in out.splitlines()], [good, good])
        warnings = [line for line in err.splitlines() if "warning" in line]
        self.assertEqual(len(warnings), len(files), err)
        for path, says in files.values():  # paths that cannot be used are found first, while listing
            self.assertEqual(sum(says in line for line in warnings), 1, (says, err))
        self.assertIn("classified 2 image(s)", err)
        self.assertIn(f"skipped {len(files)} bad image(s)", err)
        only_bad = [path for path, _ in files.values()][:3]
        code, out, err = run("predict", "--checkpoint", self.ck, *CPU, "--skip-bad", *only_bad)
        self.assertEqual((code, out), (2, ""), err)
        self.assertEqual(len(err.strip().splitlines()), 4, err)  # three warnings, then why nothing was done
        self.assertIn("error: none of the 3 image(s) could be classified", err.strip().splitlines()[-1])

    def test_checkpoints_that_cannot_serve(self):
        image = self.write("x.png", self.images[0])
        other = os.path.join(self.dir, "other-model.hpck")
        rewrite_meta(self.ckpt, other, lambda meta: meta.replace("model=cnn\n", "model=resnet20\n"))
        corrupt = os.path.join(self.dir, "corrupt.hpck")
        with open(self.ckpt, "rb") as f:
            data = bytearray(f.read())
        data[len(data) // 2] ^= 0xFF
        with open(corrupt, "wb") as f:
            f.write(data)
        unknown = os.path.join(self.dir, "unknown-model.hpck")
        rewrite_meta(self.ckpt, unknown, lambda meta: meta.replace("model=cnn\n", "model=vgg\n"))
        shards = os.path.join(self.dir, "shards.hpck")  # packed shards name their classes in the dataset
        rewrite_meta(self.ckpt, shards, lambda meta: meta.replace("option.dataset=fashion-mnist\n",
                                                                   "option.dataset=shards\n"))
        # A position no run writes: inspect and evaluate refused it, export wrote step -5 into the model.
        position = os.path.join(self.dir, "position.hpck")
        rewrite_meta(self.ckpt, position, lambda meta: re.sub(r"(?m)^step=\d+$", "step=-5", meta))
        out = os.path.join(self.dir, "m.onnx")
        cases = [(shards, "pass --data-dir DIR (the packed dataset it was trained on)"),
                 (position, "position is invalid (step -5"),
                 (other, "the checkpoint's parameters do not fit this resnet20"),
                 (corrupt, "is corrupt (checksum mismatch"),
                 (unknown, "unknown model (in the checkpoint) 'vgg'"),
                 (os.path.join(self.dir, "nothing-here"), "nothing-here")]
        for path, says in cases:
            with self.subTest(path):
                self.assert_refused(["predict", "--checkpoint", path, *CPU, image], says)
                self.assert_refused(["export", "--checkpoint", path, "--output", out], says)
                self.assertFalse(os.path.exists(out), "a refused export wrote its output")

    def test_inspect_json_keeps_its_own_keys(self):
        # A header that names inspect's own keys (a crafted or damaged file): its "valid", "path"
        # and "error" were printed in inspect's place, valid "yes" for a file inspect refused.
        crafted = os.path.join(self.dir, "crafted.hpck")
        rewrite_meta(self.ckpt, crafted, lambda meta: meta.replace("model=cnn\n", "model=resnet20\n") +
                     "valid=yes\npath=other.hpck\nerror=\nsize_bytes=1\nbytes.parameters=1\n")
        code, out, err = run("inspect", "--json", crafted)
        self.assertEqual(code, 2, err)
        j = json.loads(out)
        self.assertEqual((j["path"], j["valid"], j["size_bytes"]), (crafted, "no", os.path.getsize(crafted)), out)
        self.assertIn("do not fit this resnet20", j["error"])
        self.assertNotEqual(j.get("bytes.parameters"), 1, out)
        # A path that is not UTF-8 is told apart as predict's --json tells it (path_escaped).
        raw = os.path.join(os.fsencode(self.dir), b"\xff.hpck")
        shutil.copy(self.ckpt, raw)
        code, out, err = run("inspect", "--json", raw)
        self.assertEqual(code, 0, err)
        self.assertEqual(json.loads(out)["path_escaped"], os.fsdecode(os.path.join(os.fsencode(self.dir), b"\\xff.hpck")))

    def test_a_data_dir_for_a_model_not_of_packed_shards_is_refused(self):
        """--data-dir names a packed dataset, for a model trained on packed shards only: given for
        one of Fashion-MNIST (classes fixed) it was passed over in silence, exit 0, the user left
        believing it had been checked. Refused as --image-size is for a dataset it does not apply
        to: one line, exit 2, nothing printed or written."""
        image = self.write("x.png", self.images[0])
        out = os.path.join(self.dir, "m.onnx")
        says = ("--data-dir applies to a model trained on packed shards only; the checkpoint's cnn was trained on "
                "fashion-mnist, whose classes are fixed: leave --data-dir out")
        for data_dir in (FASHION_MNIST, os.path.join(self.dir, "nothing-here")):
            with self.subTest(data_dir):
                self.assertEqual(self.assert_refused(["predict", "--checkpoint", self.ck, *CPU, image,
                                                      "--data-dir", data_dir], says), "")
                self.assert_refused(["export", "--checkpoint", self.ck, "--output", out, "--data-dir", data_dir], says)
                self.assertFalse(os.path.exists(out), "a refused export wrote its output")

    # ---- export's output ---------------------------------------------------------------------------

    def test_export_output_is_checked_first_and_replaced_atomically(self):
        out = os.path.join(self.dir, "model.onnx")
        self.assert_refused(["export", "--checkpoint", self.ck, "--output", os.path.join(self.dir, "no", "m.onnx")],
                            f"directory {os.path.join(self.dir, 'no')} does not exist")
        self.assert_refused(["export", "--checkpoint", self.ck, "--output", self.dir], "is a directory")
        # Under a checkpoint's name, every later command took it for the newest checkpoint, damaged.
        self.assert_refused(["export", "--checkpoint", self.ck, "--output", os.path.join(self.ck, "ckpt-000000099.hpck"),
                             "--force"], "is named as hpctrain names its checkpoints (ckpt-N.hpck)")
        self.assertEqual(len([n for n in os.listdir(self.ck) if n.endswith(".hpck")]), 1, os.listdir(self.ck))
        # Nor under a name the checkpoint directory's own files take: --force replaced its heartbeat
        # with the model, and a new lock or run-id was the next run's to trip on.
        before = sorted(os.listdir(self.ck))
        with open(os.path.join(self.ck, "heartbeat"), "rb") as f:
            heartbeat = f.read()
        # (Through a link elsewhere too: the link's folder was taken for the checkpoint's.)
        link = os.path.join(self.dir, "link.hpck")
        os.symlink(self.ckpt, link)
        for checkpoint in (self.ck, self.ckpt, link):
            for name in ("heartbeat", "lock", "run-id"):
                self.assert_refused(["export", "--checkpoint", checkpoint, "--output", os.path.join(self.ck, name),
                                     "--force"], f"is in the checkpoint's directory under a name its own files take "
                                                 f"({name})")
        os.remove(link)
        self.assertEqual(sorted(os.listdir(self.ck)), before)
        with open(os.path.join(self.ck, "heartbeat"), "rb") as f:
            self.assertEqual(f.read(), heartbeat)
        # A link to a missing file exists as well: it was replaced without --force.
        dangling = os.path.join(self.dir, "dangling.onnx")
        os.symlink(os.path.join(self.dir, "no", "target.onnx"), dangling)
        self.assert_refused(["export", "--checkpoint", self.ck, "--output", dangling],
                            "exists, a link to a missing file (--force replaces the link)")
        self.assertTrue(os.path.islink(dangling))
        os.remove(dangling)
        self.assert_refused(["export", "--checkpoint", self.ck, "--output", out, "--format", "tflite"],
                            "unknown --format 'tflite' (choose onnx)")
        with open(out, "wb") as f:
            f.write(b"an older model")
        self.assert_refused(["export", "--checkpoint", self.ck, "--output", out], "exists (--force replaces it)")
        with open(out, "rb") as f:
            self.assertEqual(f.read(), b"an older model")
        # A stop between the complete temporary file and its rename: the old file stays, and the
        # temporary file goes.
        env = dict(os.environ, HPCTRAIN_TEST_PAUSE_BEFORE_RENAME="60")
        p = subprocess.Popen([HPCTRAIN, "export", "--checkpoint", self.ck, "--output", out, "--force"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 60
        while not any(n.startswith("model.onnx.tmp.") for n in os.listdir(self.dir)) and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # the pause before the rename has begun (the file is written before it)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 128 + signal.SIGTERM, err)
        with open(out, "rb") as f:
            self.assertEqual(f.read(), b"an older model")
        self.assertEqual(sorted(os.listdir(self.dir)), ["model.onnx"])
        said = ok("export", "--checkpoint", self.ck, "--output", out, "--force")
        self.assertIn(f"to {out}: ONNX opset 13", said)
        with open(out, "rb") as f:
            self.assertNotEqual(f.read(), b"an older model")
        self.assertEqual(sorted(os.listdir(self.dir)), ["model.onnx"])

    def test_a_file_that_appears_during_an_export_without_force_is_kept(self):
        """The "exists" check ran before the model was made; the rename at the end replaced
        whatever another process had put at OUTPUT since, though --force was never given."""
        out = os.path.join(self.dir, "model.onnx")
        env = dict(os.environ, HPCTRAIN_TEST_PAUSE_BEFORE_RENAME="2")
        p = subprocess.Popen([HPCTRAIN, "export", "--checkpoint", self.ck, "--output", out], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 60
        while not any(n.startswith("model.onnx.tmp.") for n in os.listdir(self.dir)) and time.time() < deadline:
            time.sleep(0.05)
        with open(out, "wb") as f:
            f.write(b"another's model")
        _, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 2, err)
        self.assertIn(f"cannot write --output {out}", err)
        self.assertIn("appeared while it was being written, and is kept", err)
        with open(out, "rb") as f:
            self.assertEqual(f.read(), b"another's model")
        self.assertEqual(sorted(os.listdir(self.dir)), ["model.onnx"])
        # With --force, replaced as asked; a new file, as before.
        self.assertIn(f"to {out}: ONNX opset 13", ok("export", "--checkpoint", self.ck, "--output", out, "--force"))
        os.remove(out)
        self.assertIn(f"to {out}: ONNX opset 13", ok("export", "--checkpoint", self.ck, "--output", out))

    def test_an_export_killed_before_its_rename_leaves_no_file_for_good(self):
        """SIGKILL runs no handler: the killed export leaves OUT.tmp.PID, which every later export to
        OUT kept (one more at each kill). The next export removes it and says so; a temporary file
        of a live process (a write under way) is left alone."""
        out = os.path.join(self.dir, "model.onnx")
        env = dict(os.environ, HPCTRAIN_TEST_PAUSE_BEFORE_RENAME="60")
        p = subprocess.Popen([HPCTRAIN, "export", "--checkpoint", self.ck, "--output", out], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        left = f"model.onnx.tmp.{p.pid}"
        deadline = time.time() + 60
        while left not in os.listdir(self.dir) and time.time() < deadline:
            time.sleep(0.05)
        p.kill()
        p.wait(timeout=60)
        self.assertEqual(sorted(os.listdir(self.dir)), [left])
        alive = f"model.onnx.tmp.{os.getpid()}"  # this test's own PID: a live process's write
        with open(os.path.join(self.dir, alive), "wb") as f:
            f.write(b"being written")
        code, said, err = run("export", "--checkpoint", self.ck, "--output", out)
        self.assertEqual(code, 0, err)
        self.assertIn(f"to {out}: ONNX opset 13", said)
        self.assertIn(f"removed {os.path.join(self.dir, left)}, left by an earlier write to {out}", said)  # info
        self.assertEqual(sorted(os.listdir(self.dir)), sorted(["model.onnx", alive]))

    def test_an_export_into_a_folder_it_cannot_write_says_so_first(self):
        """It was found after the model was made, as "cannot create DIR/m.onnx.tmp.PID", a file the
        user never named. As root (CI), hpctrain runs without the capabilities that let root past
        permission bits, so that the test runs everywhere."""
        locked = os.path.join(self.dir, "locked")
        os.mkdir(locked, 0o555)
        out = os.path.join(locked, "m.onnx")
        prefix = ["/usr/bin/setpriv", "--inh-caps=-dac_override,-dac_read_search",
                  "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
        p = subprocess.run(prefix + [HPCTRAIN, "export", "--checkpoint", self.ck, "--output", out],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
        self.assertEqual((p.returncode, p.stdout), (2, ""), p.stderr)
        self.assertEqual(p.stderr.strip().splitlines(),
                         [f"hpctrain: error: cannot write --output {out}: directory {locked} is not writable "
                          "(Permission denied)"])
        self.assertEqual(os.listdir(locked), [])

    def test_an_output_name_without_room_for_its_temporary_tail_is_refused_first(self):
        """A 255-byte name is a file name Linux takes, but the export writes NAME.tmp.PID first:
        that failed after the model was made, naming the temporary file. 243 bytes still fit."""
        out = os.path.join(self.dir, "m" * 250 + ".onnx")
        self.assert_refused(["export", "--checkpoint", self.ck, "--output", out],
                            f"cannot write --output {out}: its name is 255 bytes, and it is written first as "
                            f"NAME.tmp.PID, 12 bytes longer, where {self.dir} takes names of at most 255 bytes: "
                            "give a name of at most 243 bytes")
        self.assertNotIn(os.path.basename(out), os.listdir(self.dir))
        fits = os.path.join(self.dir, "m" * 238 + ".onnx")
        code, _, err = run("export", "--checkpoint", self.ck, "--output", fits)
        self.assertEqual(code, 0, err)
        self.assertTrue(os.path.isfile(fits))

    def test_no_output_replaces_the_checkpoint_it_reads(self):
        """export --output (even with --force) and evaluate --metrics-file naming the checkpoint
        read, by any spelling or link, or for a directory its newest file or itself: refused (exit
        2, one line naming both) and every checkpoint keeps its bytes."""
        run_dir = os.path.join(self.dir, "run")
        shutil.copytree(self.ck, run_dir)
        os.makedirs(os.path.join(self.dir, "sub"))
        name = os.path.basename(self.ckpt)
        ckpt = os.path.join(run_dir, name)
        os.symlink(ckpt, os.path.join(self.dir, "link.hpck"))
        os.link(ckpt, os.path.join(self.dir, "hard.hpck"))

        def contents():
            found = {}
            for n in sorted(os.listdir(run_dir)):
                if n.endswith(".hpck"):
                    with open(os.path.join(run_dir, n), "rb") as f:
                        found[n] = f.read()
            return found

        before = contents()
        said = f"is the same file as --checkpoint {ckpt}, which is read"
        cases = [(ckpt, ckpt, said),
                 (ckpt, os.path.join(run_dir, ".", name), said),
                 (ckpt, os.path.join(self.dir, "sub", "..", "run", name), said),
                 (ckpt, os.path.join(self.dir, "link.hpck"), said),
                 (ckpt, os.path.join(self.dir, "hard.hpck"), said),
                 (os.path.join(self.dir, "link.hpck"), ckpt, "is the same file as --checkpoint"),
                 (run_dir, ckpt, f"is the same file as --checkpoint {run_dir}'s checkpoint {ckpt}"),
                 (run_dir + "/", os.path.join(self.dir, "sub", "..", "run", name), "'s checkpoint"),
                 (run_dir, run_dir, f"--output {run_dir} is the same file as --checkpoint {run_dir}")]
        for checkpoint, output, message in cases:
            with self.subTest(checkpoint=checkpoint, output=output):
                self.assert_refused(["export", "--checkpoint", checkpoint, "--output", output, "--force"], message)
                self.assertEqual(contents(), before, "a refused export changed a checkpoint")
                evaluate = ["evaluate", "--checkpoint", checkpoint, "--metrics-file", output, "--threads", "2"]
                self.assert_refused(evaluate, message.replace("--output", "--metrics-file"))
                self.assertEqual(contents(), before, "a refused evaluate changed a checkpoint")
        self.assertEqual(sorted(os.listdir(run_dir)), sorted(os.listdir(self.ck)))
        # Another file, a stream: written as before.
        ok("export", "--checkpoint", run_dir, "--output", os.path.join(run_dir, "model.onnx"))
        self.assertEqual(contents(), before)

    def test_help_documents_the_options(self):
        for command, options in [("export", ["--checkpoint", "--output", "--fold-batch-norm", "--force", "--format"]),
                                 ("predict", ["--checkpoint", "--top-k", "--json", "--logits", "--batch-size",
                                              "--device", "--skip-bad", "--threads"])]:
            out = ok(command, "--help")
            for option in options:
                self.assertIn(option, out, command)
        self.assertIn("hpctrain predict", ok("--help"))


class ShardClasses(unittest.TestCase):
    """A model trained on packed shards (classes cat and dog) takes its class names from its
    checkpoint: predict and export need no --data-dir, and one of other classes (a and b) is
    refused, naming both. A checkpoint written before the names were recorded takes
    them from --data-dir, with one warning saying so."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="hpctrain-classes-")
        cls.cats_dogs, cls.other = os.path.join(cls.tmp, "cats-dogs"), os.path.join(cls.tmp, "a-b")
        pack(cls.cats_dogs, ["cat", "dog"], cls.tmp)
        pack(cls.other, ["a", "b"], cls.tmp)
        ck = os.path.join(cls.tmp, "ck")
        ok("--model", "mlp", "--dataset", "shards", "--data-dir", cls.cats_dogs, "--image-size", "8", "--max-steps",
           "2", "--batch-size", "4", "--checkpoint-dir", ck, "--quiet", *CPU)
        cls.ckpt = os.path.join(ck, sorted(n for n in os.listdir(ck) if n.endswith(".hpck"))[-1])
        cls.old = os.path.join(cls.tmp, "old.hpck")
        rewrite_meta(cls.ckpt, cls.old, without_class_names)
        cls.image = os.path.join(cls.tmp, "x.png")
        cv2.imwrite(cls.image, np.full((20, 20, 3), 100, np.uint8))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, True)

    @staticmethod
    def warnings(err):
        return [line for line in err.splitlines() if "warning" in line]

    def names(self, checkpoint, *options):
        """The class names predict gives the image, and its warnings."""
        code, out, err = run("predict", "--checkpoint", checkpoint, "--json", *CPU, self.image, *options)
        self.assertEqual(code, 0, err)
        return sorted(t["name"] for t in json.loads(out)["top"]), self.warnings(err)

    def exported_names(self, checkpoint, *options):
        import onnx  # Debian's python3-onnx, as onnx_test
        path = os.path.join(self.tmp, "m.onnx")
        code, _, err = run("export", "--checkpoint", checkpoint, "--output", path, "--force", *options)
        self.assertEqual(code, 0, err)
        return json.loads({p.key: p.value for p in onnx.load(path).metadata_props}["class_names"]), self.warnings(err)

    def assert_refused(self, args, *messages):
        code, out, err = run(*args)
        self.assertEqual((code, out), (2, ""), err)
        lines = err.strip().splitlines()
        self.assertEqual(len(lines), 1, err)
        for message in messages:
            self.assertIn(message, lines[0])

    def test_the_checkpoint_names_its_classes(self):
        for options in ([], ["--data-dir", self.cats_dogs]):  # no --data-dir, or one that agrees
            with self.subTest(options=options):
                self.assertEqual(self.names(self.ckpt, *options), (["cat", "dog"], []))
                self.assertEqual(self.exported_names(self.ckpt, *options), (["cat", "dog"], []))
        code, out, err = run("predict", "--checkpoint", self.ckpt, *CPU, self.image)
        self.assertEqual(code, 0, err)
        self.assertRegex(out, r": (cat|dog) [0-9.]+, (cat|dog) [0-9.]+\n$")
        self.assertIn('class names: ["cat","dog"] (digest ', ok("inspect", self.ckpt))

    def test_a_data_dir_of_other_classes_is_refused(self):
        output = os.path.join(self.tmp, "refused.onnx")
        for args in (["predict", "--checkpoint", self.ckpt, *CPU, self.image, "--data-dir", self.other],
                     ["export", "--checkpoint", self.ckpt, "--output", output, "--data-dir", self.other]):
            with self.subTest(args[0]):
                self.assert_refused(args, f"--data-dir {self.other} names the classes a,b",
                                    "trained on cat,dog")
        self.assertFalse(os.path.exists(output))

    def test_evaluate_and_resume_refuse_a_dataset_of_other_classes(self):
        says = f"the packed dataset {self.other} names the classes a,b but the checkpoint's model was trained on cat,dog"
        self.assert_refused(["evaluate", "--checkpoint", self.ckpt, "--data-dir", self.other, "--threads", "2"], says)
        ck = os.path.join(self.tmp, "resumed")
        # The checkpoints alone: a copied run-id is another directory's, which a run says first.
        shutil.copytree(os.path.dirname(self.ckpt), ck, ignore=shutil.ignore_patterns("run-id", "lock", "heartbeat"))
        self.assert_refused(["--model", "mlp", "--dataset", "shards", "--data-dir", self.other, "--image-size", "8",
                             "--max-steps", "2", "--batch-size", "4", "--checkpoint-dir", ck, "--quiet", *CPU], says)

    def test_an_older_checkpoint_takes_the_names_of_data_dir_and_says_so(self):
        warning = (f"hpctrain: warning: the checkpoint records no class names (written before 2026-11-26); "
                   f"using those of the packed dataset {self.other}")
        self.assertEqual(self.names(self.old, "--data-dir", self.other), (["a", "b"], [warning]))
        self.assertEqual(self.exported_names(self.old, "--data-dir", self.other), (["a", "b"], [warning]))
        self.assert_refused(["predict", "--checkpoint", self.old, *CPU, self.image],
                            "records no class names (written before 2026-11-26): pass --data-dir DIR")

    def test_a_stale_classes_txt_names_nothing(self):
        """classes.txt is for people: training reads a dataset's classes from its manifests, and so do
        predict and export. One that says otherwise refused the very dataset a model was trained on,
        and gave an older checkpoint's classes the wrong names."""
        stale = os.path.join(self.tmp, "stale")
        shutil.copytree(self.cats_dogs, stale)
        with open(os.path.join(stale, "classes.txt"), "w") as f:
            f.write("tench\ngoldfish\n")
        self.assertEqual(self.names(self.ckpt, "--data-dir", stale), (["cat", "dog"], []))
        self.assertEqual(self.exported_names(self.ckpt, "--data-dir", stale), (["cat", "dog"], []))
        warning = (f"hpctrain: warning: the checkpoint records no class names (written before 2026-11-26); "
                   f"using those of the packed dataset {stale}")
        self.assertEqual(self.names(self.old, "--data-dir", stale), (["cat", "dog"], [warning]))
        self.assertEqual(self.exported_names(self.old, "--data-dir", stale), (["cat", "dog"], [warning]))


if __name__ == "__main__":
    unittest.main(verbosity=2)

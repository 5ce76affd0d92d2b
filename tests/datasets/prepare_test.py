"""hpcdata prepare, offline: Fashion-MNIST from Debian's package (verified by content) and
hpctrain training on the result; CIFAR-10/100 and MNIST from archives the test makes (their
checksums are not the published ones: refused, then taken with --no-verify, structure still
checked); downloads from a mirror on loopback; corrupt, truncated and wrong archives are one
error line naming the user's file and leave nothing behind. Preparing again (--force, a stale
DIR) works the checkpoint way: a failure or a signal leaves the prepared DIR byte for byte as
it was. Bad arguments are usage errors that change nothing."""

import gzip
import hashlib
import http.server
import io
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import unittest
import zlib

from tree_snapshot import interrupted_as_imports_begin, snapshot

HERE = os.path.dirname(os.path.abspath(__file__))
HPCDATA = os.path.join(HERE, "..", "..", "datasets", "hpcdata")
HPCTRAIN = os.environ.get("HPCTRAIN")
FASHION = os.environ.get("FASHION_MNIST") or "/usr/share/datasets/fashion-mnist"


def hpcdata(*args, **kw):
    p = subprocess.run([sys.executable, HPCDATA, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=300, **kw)
    return p.returncode, p.stdout, p.stderr




def error_lines(err):
    """The error lines of hpcdata's stderr (the others are progress)."""
    return [line for line in err.splitlines() if line.startswith("hpcdata: error:")]


def idx_images(n, rows=28, cols=28):
    return (0x803).to_bytes(4, "big") + n.to_bytes(4, "big") + rows.to_bytes(4, "big") + cols.to_bytes(4, "big") + \
        bytes((i * 7) % 256 for i in range(n * rows * cols))


def idx_labels(n):
    return (0x801).to_bytes(4, "big") + n.to_bytes(4, "big") + bytes(i % 10 for i in range(n))


def cifar_tarball(path, top, members, record, label_bytes, classes):
    """A tarball laid out as the published one, each member a whole number of records with valid
    labels (record i: labels i % classes) and pixels following a pattern."""
    with tarfile.open(path, "w:gz", compresslevel=1) as tar:
        for name, size in members.items():
            n = size // record
            one = bytearray()
            for i in range(100):
                one += bytes([i % classes] * label_bytes) + bytes((i + p) % 256 for p in range(record - label_bytes))
            data = bytes(one) * (n // 100)
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        info = tarfile.TarInfo(f"{top}/readme.html")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"hello"))


class Prepare(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="hpcdata-prepare-")
        cls.archives = os.path.join(cls.tmp, "archives")
        os.makedirs(cls.archives)
        cls.cifar10 = os.path.join(cls.archives, "cifar-10-binary.tar.gz")
        cifar_tarball(cls.cifar10, "cifar-10-batches-bin",
                      {**{f"data_batch_{i}.bin": 30730000 for i in range(1, 6)}, "test_batch.bin": 30730000},
                      3073, 1, 10)
        cls.cifar100 = os.path.join(cls.archives, "cifar-100-binary.tar.gz")
        cifar_tarball(cls.cifar100, "cifar-100-binary", {"train.bin": 153700000, "test.bin": 30740000}, 3074, 2, 100)
        cls.mnist = os.path.join(cls.archives, "mnist")
        os.makedirs(cls.mnist)
        for name, data in {"train-images-idx3-ubyte.gz": idx_images(300), "train-labels-idx1-ubyte.gz": idx_labels(300),
                           "t10k-images-idx3-ubyte.gz": idx_images(100), "t10k-labels-idx1-ubyte.gz": idx_labels(100)}.items():
            with gzip.open(os.path.join(cls.mnist, name), "wb", compresslevel=1) as f:
                f.write(data)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def out(self, name):
        return os.path.join(self.tmp, "out", name)

    def test_a_directory_that_cannot_be_printed_is_an_error(self):
        """DIR on stdout is what `DIR=$(hpcdata prepare ...)` takes: on a full disk (/dev/full) Python
        said so only at its exit, in an "Exception ignored" block and exit 120. One line, exit 2,
        the dataset prepared all the same."""
        dest = self.out("full-stdout")
        for attempt in ("prepared", "already prepared"):
            with self.subTest(attempt), open("/dev/full", "w") as full:
                p = subprocess.run([sys.executable, HPCDATA, "prepare", "mnist", "--from", self.mnist, "--no-verify",
                                    "--out", dest, "--progress", "off"], stdout=full, stderr=subprocess.PIPE,
                                   text=True, timeout=300)
                self.assertEqual(p.returncode, 2, p.stderr)
                self.assertEqual(error_lines(p.stderr),
                                 ["hpcdata: error: cannot write the results to standard output: No space left on device"])
                self.assertNotIn("Exception", p.stderr)
        self.assertTrue(os.path.exists(os.path.join(dest, "hpcdata.json")))

    def test_a_directory_that_is_not_utf8_is_printed_as_its_bytes(self):
        """In a UTF-8 locale other than C.UTF-8 Python's standard output is strict: a DIR that is not
        UTF-8 was prepared, then printing it raised a traceback (exit 1)."""
        dest = os.path.join(os.fsencode(self.tmp), b"out", b"caf\xe9")
        env = {**os.environ, "PYTHONIOENCODING": "utf-8:strict"}
        for attempt in ("prepared", "already prepared"):
            with self.subTest(attempt):
                p = subprocess.run([sys.executable, HPCDATA, "prepare", "mnist", "--from", self.mnist, "--no-verify",
                                    "--out", dest, "--progress", "off"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   timeout=300, env=env)
                self.assertEqual((p.returncode, p.stdout), (0, dest + b"\n"), p.stderr.decode(errors="replace"))

    def train(self, dataset, data_dir):
        if not HPCTRAIN:
            self.skipTest("HPCTRAIN (the hpctrain binary) is not set")
        p = subprocess.run([HPCTRAIN, "--dataset", dataset, "--data-dir", data_dir, "--model", "mlp", "--max-steps", "3",
                            "--batch-size", "32", "--test-samples", "64"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
        self.assertEqual(p.returncode, 0, p.stdout)
        return p.stdout

    @unittest.skipUnless(os.path.isdir(FASHION), "Debian's dataset-fashion-mnist is not installed")
    def test_fashion_mnist_from_debian_then_trains(self):
        out = self.out("fashion")
        code, stdout, err = hpcdata("prepare", "fashion-mnist", "--out", out, "--offline", "--from", FASHION)
        self.assertEqual(code, 0, err)
        self.assertEqual(stdout.strip(), out)
        self.assertEqual(err.count("contents match the published dataset"), 4, err)
        with open(os.path.join(out, "hpcdata.json")) as f:
            manifest = json.load(f)
        self.assertEqual(manifest["dataset"], "fashion-mnist")
        self.assertEqual(len(manifest["files"]), 4)
        self.assertTrue(manifest["verified"])
        code, _, err = hpcdata("prepare", "fashion-mnist", "--out", out, "--offline")
        self.assertEqual(code, 0, err)
        self.assertIn("already prepared", err)
        self.train("fashion-mnist", out)
        # Read as MNIST (the same file names and sizes) it trained without a word.
        p = subprocess.run([HPCTRAIN, "--dataset", "mnist", "--data-dir", out, "--max-steps", "1"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
        self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
        self.assertEqual(p.stderr.strip(), f"hpctrain: error: --data-dir {out} holds fashion-mnist (its hpcdata.json, "
                                           "from hpcdata prepare, says so), not mnist: give --dataset fashion-mnist")

    def test_under_umask_000_nothing_it_makes_is_writable_by_others(self):
        """A verified dataset was 0666 in a 0777 DIR under umask 000: any user could swap it after
        its checksums passed. Now neither DIR (nor the directories made above it) nor any file in
        it is others' to write."""
        top = self.out("umask000")
        out = os.path.join(top, "deeper", "mnist")
        before = os.umask(0)
        try:
            code, _, err = hpcdata("prepare", "mnist", "--out", out, "--offline", "--no-verify", "--from", self.mnist)
        finally:
            os.umask(before)
        self.assertEqual(code, 0, err)
        made = [top] + [os.path.join(d, n) for d, dirs, files in os.walk(top) for n in dirs + files]
        self.assertGreater(len(made), 5, made)
        for path in made:
            self.assertEqual(os.lstat(path).st_mode & 0o002, 0, f"{path} is writable by others")

    def test_a_dir_others_may_write_to_is_refused(self):
        """A DIR every user may write to (another user's 777 in /tmp): they could swap the files after
        their checks, or plant an hpcdata.json that made prepare say "already prepared" over files
        of their choosing. Refused, one line, exit 2, whether prepared already or empty."""
        out = self.out("open")
        code, _, err = hpcdata("prepare", "mnist", "--out", out, "--offline", "--no-verify", "--from", self.mnist)
        self.assertEqual(code, 0, err)
        empty = self.out("open-empty")
        os.makedirs(empty)
        for d in (out, empty):
            os.chmod(d, 0o777)
            before = sorted(os.listdir(d))
            code, stdout, err = hpcdata("prepare", "mnist", "--out", d, "--offline", "--no-verify", "--from", self.mnist)
            self.assertEqual((code, stdout), (2, ""), err)
            self.assertEqual(err.splitlines(), [f"hpcdata: error: --out {d} is writable by others (mode 777): another "
                                                "user could replace the dataset after its checks; chmod o-w it, or "
                                                "prepare into a directory of your own"])
            self.assertEqual(sorted(os.listdir(d)), before)
            os.chmod(d, 0o775)  # a team's: its group may write
            code, _, err = hpcdata("prepare", "mnist", "--out", d, "--offline", "--no-verify", "--from", self.mnist)
            self.assertEqual(code, 0, err)

    def test_a_dir_in_a_folder_others_may_write_to_is_refused(self):
        """A DIR, there or to be made, in a folder every user may write to that is not sticky (one
        another user made in /tmp, mode 777): they could rename it away after its checks and put a
        dataset of their own in its place, as hpcdata pack and hpctrain's checkpoint directory
        refuse. Exit 2, one line, before anything is made; a sticky folder (as /tmp) or a team's
        (group write) is fine."""
        folder = self.out("open-folder")
        os.makedirs(os.path.join(folder, "there"))
        os.chmod(folder, 0o777)
        for d in (os.path.join(folder, "fm"), os.path.join(folder, "new", "fm"), os.path.join(folder, "there")):
            code, stdout, err = hpcdata("prepare", "mnist", "--out", d, "--offline", "--no-verify", "--from", self.mnist)
            self.assertEqual((code, stdout), (2, ""), err)
            self.assertEqual(err.splitlines(), [f"hpcdata: error: --out {d}: {folder} is writable by others (mode 777) "
                                                f"and not sticky: another user could rename {d} away and put a "
                                                "dataset of their choosing in its place; use a directory of your own"])
            self.assertEqual(sorted(os.listdir(folder)), ["there"])
            self.assertEqual(os.listdir(os.path.join(folder, "there")), [])
        for mode in (0o1777, 0o775):  # sticky, as /tmp; a team's
            os.chmod(folder, mode)
            code, _, err = hpcdata("prepare", "mnist", "--out", os.path.join(folder, "new", "fm"), "--offline",
                                   "--no-verify", "--from", self.mnist)
            self.assertEqual(code, 0, err)

    def test_cifar100_archive_unpacks_and_trains(self):
        out = self.out("cifar100")
        code, _, err = hpcdata("prepare", "cifar100", "--out", out, "--offline", "--from", self.archives)
        self.assertEqual(code, 1)
        self.assertIn("is not the published cifar-100-binary.tar.gz", err)
        self.assertEqual(len(error_lines(err)), 1, err)
        self.assertFalse(os.path.exists(out))  # neither the refused archive nor the directory made for it
        code, _, err = hpcdata("prepare", "cifar100", "--out", out, "--offline", "--from", self.cifar100, "--no-verify")
        self.assertEqual(code, 0, err)
        self.assertEqual(sorted(os.listdir(out)), ["hpcdata.json", "test.bin", "train.bin"])
        self.train("cifar100", out)

    def test_cifar10_archive_and_broken_ones(self):
        out = self.out("cifar10")
        code, _, err = hpcdata("prepare", "cifar10", "--out", out, "--offline", "--from", self.archives, "--no-verify")
        self.assertEqual(code, 0, err)
        self.assertEqual(sorted(os.listdir(out)), ["data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin",
                                                   "data_batch_4.bin", "data_batch_5.bin", "hpcdata.json",
                                                   "test_batch.bin"])
        # Truncated: cut in the middle of the compressed stream.
        broken = os.path.join(self.tmp, "broken")
        os.makedirs(broken)
        with open(self.cifar10, "rb") as f:
            data = f.read()
        with open(os.path.join(broken, "cifar-10-binary.tar.gz"), "wb") as f:
            f.write(data[: len(data) // 2])
        code, _, err = hpcdata("prepare", "cifar10", "--out", self.out("cut"), "--from", broken, "--no-verify")
        self.assertEqual(code, 1)
        self.assertIn("cannot be unpacked", err)
        self.assertEqual(len(error_lines(err)), 1, err)
        self.assertIn(os.path.join(broken, "cifar-10-binary.tar.gz"), err)  # the user's file, not a temporary
        self.assertFalse(os.path.exists(self.out("cut")))  # neither the archive nor half its members
        # Whole but for its CRC (the stream's last bytes): unpacked as it was under --no-verify,
        # which skips only the published checksums.
        with open(os.path.join(broken, "cifar-10-binary.tar.gz"), "wb") as f:
            f.write(data[:-8] + bytes([data[-8] ^ 1]) + data[-7:])
        code, _, err = hpcdata("prepare", "cifar10", "--out", self.out("crc"), "--from", broken, "--no-verify")
        self.assertEqual(code, 1, err)
        self.assertIn("cannot be unpacked: CRC check failed", err)
        self.assertFalse(os.path.exists(self.out("crc")))
        # The other CIFAR's archive under this one's name: members missing.
        shutil.copyfile(self.cifar100, os.path.join(broken, "cifar-10-binary.tar.gz"))
        code, _, err = hpcdata("prepare", "cifar10", "--out", self.out("wrong"), "--from", broken, "--no-verify")
        self.assertEqual(code, 1)
        self.assertIn("has no file cifar-10-batches-bin/data_batch_1.bin", err)

    def test_mnist_idx_structure_is_checked(self):
        # What a prepare killed on this host left (its process is gone) is removed by the next.
        stale = os.path.join(self.out("mnist"), f".hpcdata-prepare.{socket.gethostname()}.999999999")
        os.makedirs(stale)
        code, _, err = hpcdata("prepare", "mnist", "--out", self.out("mnist"), "--from", self.mnist, "--no-verify")
        self.assertEqual(code, 0, err)
        self.assertEqual(sorted(os.listdir(self.out("mnist"))), sorted(["hpcdata.json", *os.listdir(self.mnist)]))
        bad = os.path.join(self.tmp, "bad-mnist")
        shutil.copytree(self.mnist, bad)
        with gzip.open(os.path.join(bad, "t10k-labels-idx1-ubyte.gz"), "wb") as f:
            f.write(idx_labels(100)[:-3])  # three labels short of the header's count
        code, _, err = hpcdata("prepare", "mnist", "--out", self.out("bad-mnist"), "--from", bad, "--no-verify")
        self.assertEqual(code, 1)
        self.assertIn("truncated or corrupt", err)
        with open(os.path.join(bad, "t10k-labels-idx1-ubyte.gz"), "wb") as f:
            f.write(b"not gzip at all")
        code, _, err = hpcdata("prepare", "mnist", "--out", self.out("bad-mnist"), "--from", bad, "--no-verify")
        self.assertEqual(code, 1)
        self.assertIn("not a readable gzip file", err)
        # Zeros after the stream (a copy padded to a block): gzip passes over them, hpctrain refuses
        # them: prepared, the directory did not train. Two members, as gzip -d reads them, pass.
        labels = gzip.compress(idx_labels(100))
        for tail, ok in ((bytes(512), False), (gzip.compress(b""), True)):
            with open(os.path.join(bad, "t10k-labels-idx1-ubyte.gz"), "wb") as f:
                f.write(labels + tail)
            code, _, err = hpcdata("prepare", "mnist", "--out", self.out("padded"), "--from", bad, "--no-verify",
                                   "--force")
            if ok:
                self.assertEqual(code, 0, err)
            else:
                self.assertEqual(code, 1, err)
                self.assertIn("is corrupt: 512 bytes that are not gzip data follow its compressed stream", err)
                self.assertFalse(os.path.exists(self.out("padded")))

    def test_idx_files_hpctrain_would_refuse_are_refused(self):
        # Under --no-verify only the structure is checked: what hpctrain refuses (another image
        # size, a label past the classes, images and labels that disagree) was prepared anyway.
        bad = os.path.join(self.tmp, "refused-mnist")
        past = idx_labels(100)[:-1] + bytes([10])
        cases = (("t10k-images-idx3-ubyte.gz", idx_images(100, 32, 32), "holds 32x32 images where the dataset's are 28x28"),
                 ("t10k-labels-idx1-ubyte.gz", past, "holds label 10, out of range for its 10 classes"),
                 ("t10k-labels-idx1-ubyte.gz", idx_labels(90), "holds 100 images but"))
        for name, data, error in cases:
            shutil.rmtree(bad, ignore_errors=True)
            shutil.copytree(self.mnist, bad)
            with gzip.open(os.path.join(bad, name), "wb") as f:
                f.write(data)
            code, _, err = hpcdata("prepare", "mnist", "--out", self.out("refused"), "--from", bad, "--no-verify")
            self.assertEqual(code, 1, err)
            self.assertIn(error, err)
            self.assertEqual(len(error_lines(err)), 1, err)
            self.assertFalse(os.path.exists(self.out("refused")))

    def test_an_idx_file_that_inflates_past_its_header_costs_no_memory(self):
        # 1 MB that inflates to 1 GiB of zeros, under a header of 100 images: inflated whole, in
        # one piece, it took that much memory (and the time) before its error.
        bad = os.path.join(self.tmp, "bomb-mnist")
        shutil.copytree(self.mnist, bad)
        z = zlib.compressobj(9, zlib.DEFLATED, 31)
        bomb = z.compress(idx_images(100)[:16])
        zeros = bytes(1 << 20)
        for _ in range(1024):
            bomb += z.compress(zeros)
        bomb += z.flush()
        with open(os.path.join(bad, "t10k-images-idx3-ubyte.gz"), "wb") as f:
            f.write(bomb)
        with tempfile.TemporaryFile() as err_file:
            p = subprocess.Popen([sys.executable, HPCDATA, "prepare", "mnist", "--out", self.out("bomb"), "--from", bad,
                                  "--no-verify"], stdout=subprocess.DEVNULL, stderr=err_file)
            _, status, usage = os.wait4(p.pid, 0)
            p.returncode = os.waitstatus_to_exitcode(status)
            err_file.seek(0)
            err = err_file.read().decode()
        self.assertEqual(p.returncode, 1, err)
        self.assertIn(f"holds more than the {100 * 28 * 28} bytes of data its header announces", err)
        self.assertLess(usage.ru_maxrss, 300 * 1024, f"KiB at hpcdata's peak for a {len(bomb)}-byte file")

    def test_download_from_a_mirror(self):
        directory = self.mnist

        class Quiet(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *a):
                super().__init__(*a, directory=directory)

            def log_message(self, *a):
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.addCleanup(server.server_close)
        self.addCleanup(server.shutdown)
        mirror = f"http://127.0.0.1:{server.server_address[1]}/"
        out = self.out("downloaded")
        code, _, err = hpcdata("prepare", "mnist", "--out", out, "--mirror", mirror)
        self.assertEqual(code, 1)  # the test's files are not the published ones
        self.assertIn("is not the published", err)
        self.assertFalse(os.path.exists(out))
        code, _, err = hpcdata("prepare", "mnist", "--out", out, "--mirror", mirror, "--no-verify")
        self.assertEqual(code, 0, err)
        self.assertEqual(err.count("downloading " + mirror), 4, err)
        # Asked again with verification, what --no-verify took is not "already prepared": it is
        # prepared again, checked, and refused here; the directory stays as it was.
        before = snapshot(out)
        code, _, verified = hpcdata("prepare", "mnist", "--out", out, "--mirror", mirror)
        self.assertEqual(code, 1, verified)
        self.assertNotIn("already prepared", verified)
        self.assertIn("is not the published", verified)
        self.assertEqual(snapshot(out), before)
        self.assertEqual(len([n for n in os.listdir(out) if n.endswith(".gz")]), 4)
        # stderr is a pipe, not a terminal: plain lines, each starting with the UTC time.
        stamped = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z hpcdata: ")
        self.assertTrue(err and all(stamped.match(line) for line in err.splitlines()), err)
        self.assertFalse(set(err) & {"\r", "\x1b"}, repr(err))
        code, _, err = hpcdata("prepare", "mnist", "--out", out, "--mirror", mirror, "--no-verify", "--force",
                               "--log-timestamps", "off", "--progress", "off")
        self.assertEqual(code, 0, err)
        self.assertTrue(all(line.startswith("hpcdata: ") for line in err.splitlines()), err)
        code, _, err = hpcdata("prepare", "mnist", "--out", self.out("missing"), "--mirror", mirror + "nothing/")
        self.assertEqual(code, 1)
        self.assertIn("cannot download", err)
        self.assertFalse(os.path.exists(self.out("missing")))  # no .part left, no directory

    def assert_refused(self, args, code, message, watched, **kw):
        """hpcdata ARGS exits CODE, its last line names the problem, and nothing under `watched`
        changed."""
        cwd = os.path.join(self.tmp, "cwd")  # an empty path must not mean the current directory
        os.makedirs(cwd, exist_ok=True)
        watched = [*watched, cwd]
        before = snapshot(*watched)
        got, _, err = hpcdata(*args, cwd=cwd, **kw)
        self.assertEqual(got, code, err)
        self.assertIn(message, err.strip().splitlines()[-1], err)
        self.assertEqual(len(error_lines(err)), 1, err)
        self.assertEqual(snapshot(*watched), before, "a refused prepare changed files")
        return err

    @unittest.skipUnless(os.path.isdir(FASHION), "Debian's dataset-fashion-mnist is not installed")
    def test_preparing_again_keeps_a_verified_dataset(self):
        """Issue 20: --force with one truncated file in --from deleted the verified file of the
        prepared DIR while its hpcdata.json stayed."""
        good = self.out("good")
        code, _, err = hpcdata("prepare", "fashion-mnist", "--out", good, "--offline", "--from", FASHION)
        self.assertEqual(code, 0, err)
        cut = os.path.join(self.tmp, "cut-fashion")
        shutil.copytree(FASHION, cut)
        truncated = os.path.join(cut, "t10k-labels-idx1-ubyte.gz")
        with open(truncated, "r+b") as f:
            f.truncate(3000)
        for extra in ([], ["--no-verify"]):
            with self.subTest(extra=extra):
                err = self.assert_refused(("prepare", "fashion-mnist", "--out", good, "--force", "--from", cut,
                                           "--offline", *extra), 1, truncated, [good, cut])
                self.assertNotIn(".hpcdata-prepare", err)
        # Without --force, a DIR whose files no longer match its hpcdata.json is prepared again,
        # just as safely.
        with open(os.path.join(good, "hpcdata.json")) as f:
            manifest = json.load(f)
        manifest["files"]["t10k-labels-idx1-ubyte.gz"]["bytes"] += 1
        with open(os.path.join(good, "hpcdata.json"), "w") as f:
            json.dump(manifest, f)
        self.assert_refused(("prepare", "fashion-mnist", "--out", good, "--from", cut, "--offline"), 1, truncated,
                            [good, cut])
        # Full disk, as hpcdata sees it (no file may grow past 1 MB): the error names DIR, not a
        # temporary.
        def small_files():
            resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        self.assertIn("cannot write into " + good, self.assert_refused(
            ("prepare", "fashion-mnist", "--out", good, "--force", "--from", FASHION, "--offline"), 1,
            "File too large", [good], preexec_fn=small_files))
        self.train("fashion-mnist", good)

    @unittest.skipUnless(os.path.isdir(FASHION), "Debian's dataset-fashion-mnist is not installed")
    def test_a_stop_during_the_switch_waits_for_it(self):
        """A SIGTERM while prepare --force renamed the new files into DIR left DIR without its
        manifest and with some files replaced: the verified dataset it had was lost. strace holds
        each rename half a second, so that the stop comes in the middle of the switch."""
        strace = shutil.which("strace")
        self.assertIsNotNone(strace, "no strace (run ./setup.sh)")
        out = self.out("switch")
        code, _, err = hpcdata("prepare", "fashion-mnist", "--out", out, "--offline", "--from", FASHION)
        self.assertEqual(code, 0, err)
        log = os.path.join(self.tmp, "switch.strace")
        renames = "rename,renameat,renameat2"
        job = subprocess.Popen([strace, "-f", "-o", log, "-e", "trace=" + renames, "-e",
                                f"inject={renames}:delay_exit=500000", sys.executable, HPCDATA, "prepare",
                                "fashion-mnist", "--out", out, "--force", "--offline", "--from", FASHION],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while not (os.path.exists(log) and re.search(r"rename.*\.hpcdata-prepare\..*train-", open(log).read())):
            self.assertIsNone(job.poll(), "prepare ended before its switch")
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.01)
        child = subprocess.run(["pgrep", "-P", str(job.pid)], stdout=subprocess.PIPE, text=True).stdout.split()
        self.assertEqual(len(child), 1, child)
        os.kill(int(child[0]), signal.SIGTERM)
        _, err = job.communicate(timeout=120)
        self.assertIn("stopped by SIGTERM", err)
        # DIR holds the dataset whole, its manifest naming every file as it is.
        code, _, err = hpcdata("prepare", "fashion-mnist", "--out", out, "--offline")
        self.assertEqual(code, 0, err)
        self.assertIn("already prepared", err)
        with open(os.path.join(out, "hpcdata.json")) as f:
            manifest = json.load(f)
        self.assertEqual(len(manifest["files"]), 4)
        for name, entry in manifest["files"].items():
            with open(os.path.join(out, name), "rb") as f:
                self.assertEqual(hashlib.sha256(f.read()).hexdigest(), entry["sha256"], name)

    def test_signal_part_way_leaves_dir_as_it_was(self):
        out = self.out("stopped")
        code, _, err = hpcdata("prepare", "mnist", "--out", out, "--from", self.mnist, "--no-verify")
        self.assertEqual(code, 0, err)
        before = snapshot(out)
        started, release = threading.Event(), threading.Event()

        class Stalling(http.server.BaseHTTPRequestHandler):  # sends half an archive, then waits
            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Length", "100000")
                self.end_headers()
                self.wfile.write(bytes(50000))
                self.wfile.flush()
                started.set()
                release.wait(60)

            def log_message(self, *a):
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stalling)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.addCleanup(server.server_close)
        self.addCleanup(server.shutdown)
        self.addCleanup(release.set)
        job = subprocess.Popen([sys.executable, HPCDATA, "prepare", "mnist", "--out", out, "--force", "--no-verify",
                                "--mirror", f"http://127.0.0.1:{server.server_address[1]}/"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.assertTrue(started.wait(60), "the download did not start")
        time.sleep(0.2)
        job.send_signal(signal.SIGTERM)
        _, err = job.communicate(timeout=60)
        self.assertEqual(job.returncode, 128 + signal.SIGTERM, err)
        self.assertIn("stopped by SIGTERM", err.strip().splitlines()[-1])
        self.assertEqual(snapshot(out), before)

    def test_usage_errors(self):
        prepared = self.out("prepared-mnist")
        code, _, err = hpcdata("prepare", "mnist", "--out", prepared, "--from", self.mnist, "--no-verify")
        self.assertEqual(code, 0, err)
        a_file = os.path.join(self.tmp, "a-file")
        with open(a_file, "w") as f:
            f.write("mine")
        new = self.out("u")
        root_link = os.path.join(self.tmp, "root-link")
        os.symlink("/", root_link)
        packed = self.out("packed")  # hpcdata pack's: its shards no longer trained beside an hpcdata.json
        os.makedirs(packed)
        for name in ("train.json", "train-g1-00000-of-00001.hpcs"):
            open(os.path.join(packed, name), "w").close()
        for args, code, message in [
                (("prepare", "imagenet", "--out", new), 2, "invalid choice"),
                (("prepare", "mnist"), 2, "--out"),
                (("prepare", "mnist", "--out", new, "--from", "/no/such/dir"), 2, "does not exist"),
                (("prepare", "mnist", "--out", "", "--from", self.mnist), 2, "--out is an empty path"),
                (("prepare", "mnist", "--out", new, "--from", ""), 2, "--from is an empty path"),
                # A --from that gives none of the archives, once passed over for a download or
                # Debian's copy (exit 0, the user's file never read).
                (("prepare", "mnist", "--out", new, "--from", a_file), 2,
                 f"--from {a_file} is not one of mnist's archives (train-images-idx3-ubyte.gz, "
                 "train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz): they are found "
                 "by their published names"),
                (("prepare", "fashion-mnist", "--out", new, "--from", a_file, "--offline"), 2,
                 f"--from {a_file} is not one of fashion-mnist's archives"),
                (("prepare", "cifar10", "--out", new, "--from", self.mnist), 2,
                 f"--from {self.mnist} holds none of cifar10's archives (cifar-10-binary.tar.gz)"),
                (("prepare", "cifar10", "--out", new, "--from", self.archives, "--from", self.mnist), 2,
                 "holds none of cifar10's archives"),
                (("prepare", "cifar10", "--out", new, "--from", "/dev/null"), 2,
                 "--from /dev/null is neither one of cifar10's archives (cifar-10-binary.tar.gz) nor a directory "
                 "holding one"),
                (("prepare", "mnist", "--out", a_file, "--from", self.mnist), 2, "exists and is not a directory"),
                # Never a directory: refused as a file there is, not a storage failure (exit 1).
                (("prepare", "mnist", "--out", os.path.join(a_file, "d"), "--from", self.mnist), 2,
                 "d cannot be made or used: Not a directory"),
                (("prepare", "mnist", "--out", os.path.join(self.tmp, "n" * 256), "--from", self.mnist), 2,
                 "cannot be made or used: File name too long"),
                # "$UNSET/": the root directory, by any spelling or link, is never an output directory.
                (("prepare", "mnist", "--out", "/", "--from", self.mnist), 2,
                 "--out / is the root directory / (an unset variable?)"),
                (("prepare", "mnist", "--out", "//", "--from", self.mnist), 2, "--out // is the root directory /"),
                (("prepare", "mnist", "--out", "/tmp/..", "--from", self.mnist), 2, "is the root directory /"),
                (("prepare", "mnist", "--out", root_link, "--from", self.mnist), 2, "is the root directory /"),
                (("prepare", "mnist", "--out", new, "--mirror", "mirror.example.org/mnist"), 2, "is not an http://"),
                (("prepare", "mnist", "--out", new, "--mirror", "http://"), 2, "is not an http://"),
                (("prepare", "cifar10", "--out", prepared, "--from", self.archives, "--no-verify"), 2,
                 "holds mnist"),
                (("prepare", "cifar10", "--out", prepared, "--from", self.archives, "--force"), 2, "holds mnist"),
                (("prepare", "cifar10", "--out", new, "--offline"), 1, "--offline forbids downloading"),
                (("prepare", "mnist", "--out", packed, "--from", self.mnist), 2,
                 f"--out {packed} holds packed shards (train-g1-00000-of-00001.hpcs, from hpcdata pack): prepare mnist "
                 "in another directory"),
                (("frobnicate",), 2, "invalid choice"),
                (("prepair", "mnist"), 2, "invalid choice: 'prepair' (choose from 'prepare', 'pack', 'stage'); "
                 "did you mean prepare? (try --help)"),
                (("prepare", "mnsit", "--out", new), 2, "; did you mean mnist?"),
                # Options are named whole (argparse took --forc for --force).
                (("prepare", "mnist", "--out", new, "--from", self.mnist, "--forc"), 2,
                 "unrecognized arguments: --forc (options are named whole: --force?) (try --help)")]:
            with self.subTest(args=args):
                self.assert_refused(args, code, message, [prepared, new, a_file, self.mnist])

    def test_manifest_nested_past_the_decoder_is_stale(self):
        """An hpcdata.json nested thousands deep (json's RecursionError, a traceback before) is
        malformed like any other: DIR is prepared again."""
        out = self.out("nested")
        os.makedirs(out)
        with open(os.path.join(out, "hpcdata.json"), "w") as f:
            f.write('{"dataset": "mnist", "files": ' + "[" * 5000 + "]" * 5000 + "}\n")
        code, stdout, err = hpcdata("prepare", "mnist", "--out", out, "--from", self.mnist, "--no-verify")
        self.assertEqual((code, stdout), (0, out + "\n"), err)
        self.assertNotIn("Traceback", err)
        with open(os.path.join(out, "hpcdata.json")) as f:
            self.assertEqual(sorted(json.load(f)["files"]), sorted(os.listdir(self.mnist)))

    def test_interrupt_while_starting_is_one_line_and_leaves_nothing(self):
        """Ctrl-C while hpcdata loads its modules (a good part of a second on a busy node; a
        KeyboardInterrupt traceback there before) or right after: status 130 and main()'s one
        line, never a traceback, never a DIR left behind. The signal goes as the script's own
        imports begin, seen in -X importtime's lines; earlier, while the interpreter starts and
        compiles the script, no code of the script runs to catch it."""
        for i in range(5):
            out = self.out(f"interrupted-{i}")
            status, err = interrupted_as_imports_begin([HPCDATA, "prepare", "mnist", "--out", out, "--from", self.mnist,
                                                        "--no-verify"])
            with self.subTest(run=i):
                self.assertEqual(status, 128 + signal.SIGINT, err)
                self.assertEqual(err.splitlines(), ["hpcdata: stopped by SIGINT before finishing"])
                self.assertFalse(os.path.exists(out), "an interrupted prepare left its DIR")

    def test_stop_while_the_manifests_temporary_is_made_leaves_none(self):
        """A stop signal while tempfile.mkstemp has made the manifest's temporary but not yet
        returned its name (held there by a slowed os.open): the temporary was left beside the
        prepared files, since the exception came before its name was known. Now the stop waits
        for the name, and the temporary goes as on any stop."""
        slowed_open = ("import os, runpy, sys, time\n"
                       "real_open = os.open\n"
                       "def slowed_open(path, *args, **kwargs):\n"
                       "    fd = real_open(path, *args, **kwargs)\n"
                       "    if os.path.basename(str(path)).startswith('hpcdata.json.'):\n"
                       "        time.sleep(3)\n"
                       "    return fd\n"
                       "os.open = slowed_open\n"
                       "sys.argv = sys.argv[1:]\n"
                       "runpy.run_path(sys.argv[0], run_name='__main__')\n")
        for signum in (signal.SIGTERM, signal.SIGINT):
            with self.subTest(signal=signum.name):
                out = self.out(f"stopped-creating-{signum.name}")
                job = subprocess.Popen([sys.executable, "-c", slowed_open, HPCDATA, "prepare", "mnist", "--out", out,
                                        "--from", self.mnist, "--no-verify"],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                deadline = time.monotonic() + 60
                while not (os.path.isdir(out) and any(n.endswith(".tmp") for n in os.listdir(out))):
                    self.assertIsNone(job.poll(), "prepared before the manifest's temporary was seen")
                    self.assertLess(time.monotonic(), deadline, "no temporary appeared")
                    time.sleep(0.001)
                job.send_signal(signum)
                _, err = job.communicate(timeout=60)
                self.assertEqual(job.returncode, 128 + signum, err)
                self.assertEqual(err.strip().splitlines()[-1], f"hpcdata: stopped by {signum.name} before finishing")
                self.assertEqual([n for n in os.listdir(out) if n.endswith(".tmp")], [],
                                 "a stop left the manifest's temporary")

if __name__ == "__main__":
    unittest.main()

"""hpcdata pack from the command line (the packer's library is tested in depth by
tests/unit/shards_test.cpp): a folder of real JPEGs becomes shards, classes.txt and train.json;
corrupt images fail naming the file, or are skipped and listed with --skip-corrupt. Packing
replaces a split the checkpoint way: a packing that fails (a bad image, a signal, a full disk)
leaves OUT byte for byte as it was, with nothing new in it. Bad input, to hpcdata pack or as
broken shards given to hpctrain, is one error line with the documented exit code and changes
nothing."""

import fcntl
import json
import os
import re
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unittest

from tree_snapshot import interrupted_as_imports_begin, snapshot

HERE = os.path.dirname(os.path.abspath(__file__))
HPCDATA = os.path.join(HERE, "..", "..", "datasets", "hpcdata")
HPCTRAIN = os.environ.get("HPCTRAIN")
if not os.environ.get("HPCDATA_PACK"):
    print("SKIPPED: HPCDATA_PACK (the built hpcdata-pack) is not set")
    sys.exit(77)

# Two small JPEGs (8x8 and 16x8, made with libjpeg-turbo).
JPEGS = [bytes.fromhex("ffd8ffe000104a46494600010100000100010000ffdb00430006040506050406060506070706080a100a0a09090a140e0f0c1017141818171416161a1d251f1a1b231c1616202c20232627292a29191f2d302d283025282928ffdb0043010707070a080a130a0a13281a161a2828282828282828282828282828282828282828282828282828282828282828282828282828282828282828282828282828ffc00011080008000803012200021101031101ffc4001f0000010501010101010100000000000000000102030405060708090a0bffc400b5100002010303020403050504040000017d01020300041105122131410613516107227114328191a1082342b1c11552d1f02433627282090a161718191a25262728292a3435363738393a434445464748494a535455565758595a636465666768696a737475767778797a838485868788898a92939495969798999aa2a3a4a5a6a7a8a9aab2b3b4b5b6b7b8b9bac2c3c4c5c6c7c8c9cad2d3d4d5d6d7d8d9dae1e2e3e4e5e6e7e8e9eaf1f2f3f4f5f6f7f8f9faffc4001f0100030101010101010101010000000000000102030405060708090a0bffc400b51100020102040403040705040400010277000102031104052131061241510761711322328108144291a1b1c109233352f0156272d10a162434e125f11718191a262728292a35363738393a434445464748494a535455565758595a636465666768696a737475767778797a82838485868788898a92939495969798999aa2a3a4a5a6a7a8a9aab2b3b4b5b6b7b8b9bac2c3c4c5c6c7c8c9cad2d3d4d5d6d7d8d9dae2e3e4e5e6e7e8e9eaf2f3f4f5f6f7f8f9faffda000c03010002110311003f00a9159dae93e21dba6da5a3d94c04b12dbdb43208c1eabfbab79f6e0f4dd216239a28a2aa3b0eaa4a5a765f91ffd9"),
         bytes.fromhex("ffd8ffe000104a46494600010100000100010000ffdb00430006040506050406060506070706080a100a0a09090a140e0f0c1017141818171416161a1d251f1a1b231c1616202c20232627292a29191f2d302d283025282928ffdb0043010707070a080a130a0a13281a161a2828282828282828282828282828282828282828282828282828282828282828282828282828282828282828282828282828ffc00011080010000803012200021101031101ffc4001f0000010501010101010100000000000000000102030405060708090a0bffc400b5100002010303020403050504040000017d01020300041105122131410613516107227114328191a1082342b1c11552d1f02433627282090a161718191a25262728292a3435363738393a434445464748494a535455565758595a636465666768696a737475767778797a838485868788898a92939495969798999aa2a3a4a5a6a7a8a9aab2b3b4b5b6b7b8b9bac2c3c4c5c6c7c8c9cad2d3d4d5d6d7d8d9dae1e2e3e4e5e6e7e8e9eaf1f2f3f4f5f6f7f8f9faffc4001f0100030101010101010101010000000000000102030405060708090a0bffc400b51100020102040403040705040400010277000102031104052131061241510761711322328108144291a1b1c109233352f0156272d10a162434e125f11718191a262728292a35363738393a434445464748494a535455565758595a636465666768696a737475767778797a82838485868788898a92939495969798999aa2a3a4a5a6a7a8a9aab2b3b4b5b6b7b8b9bac2c3c4c5c6c7c8c9cad2d3d4d5d6d7d8d9dae2e3e4e5e6e7e8e9eaf2f3f4f5f6f7f8f9faffda000c03010002110311003f00935e4b84d2adb58b54b9b65b5c24fb166810213c31c2dac6304e096624e4014543a05aa596a175a635b89a15263135bdba12c847043c366ca1b047dc73b4f19c8a284db578eccd23eca4bf78da6bb24ff55ff0c7ffd9")]


def big_jpeg(side):
    """A valid grey JPEG of side x side pixels that is tiny on disk (every 8x8 block flat, one
    Huffman code of one bit) but takes libjpeg-turbo a while to decode: a packing slow enough
    to be caught part-way."""
    def segment(marker, body):
        return b"\xff" + bytes([marker]) + struct.pack(">H", len(body) + 2) + body
    one_code = bytes([1] + [0] * 15) + b"\x00"  # the code "0": DC difference 0, and end of block
    return (b"\xff\xd8" + segment(0xDB, b"\x00" + bytes([1] * 64))
            + segment(0xC0, struct.pack(">BHHB", 8, side, side, 1) + b"\x01\x11\x00")
            + segment(0xC4, b"\x00" + one_code) + segment(0xC4, b"\x10" + one_code)
            + segment(0xDA, b"\x01\x01\x00\x00\x3f\x00") + bytes((side // 8) ** 2 * 2 // 8) + b"\xff\xd9")


def run(*args, **kw):
    p = subprocess.run([sys.executable, HPCDATA, "pack", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=120, **kw)
    return p.returncode, p.stderr


def error_lines(err):
    return [line for line in err.splitlines() if "error:" in line]




def hpctrain(data_dir, cwd):
    p = subprocess.run([HPCTRAIN, "--dataset", "shards", "--data-dir", data_dir, "--image-size", "16", "--model", "cnn",
                        "--max-steps", "2", "--batch-size", "4", "--threads", "2"], cwd=cwd,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


class Pack(unittest.TestCase):
    CLASSES = ["n01440764", "n01443537", "n01484850"]

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="hpcdata-pack-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.src = os.path.join(self.tmp, "src")
        self.out = os.path.join(self.tmp, "out")
        self.folder(self.src, self.CLASSES)

    def folder(self, path, classes, per_class=3):
        for c, cls in enumerate(classes):
            os.makedirs(os.path.join(path, cls))
            for i in range(per_class):
                with open(os.path.join(path, cls, f"{cls}_{i}.JPEG"), "wb") as f:
                    f.write(JPEGS[(c + i) % 2])

    def shards(self, out=None):
        out = out or self.out
        return sorted(n for n in os.listdir(out) if n.endswith(".hpcs")) if os.path.isdir(out) else []

    def manifest(self, split="train"):
        with open(os.path.join(self.out, f"{split}.json")) as f:
            return json.load(f)

    def slow_folder(self, per_class):
        """An image folder of the classes whose images take a while to decode (big_jpeg)."""
        slow = os.path.join(self.tmp, "slow")
        for cls in self.CLASSES:
            os.makedirs(os.path.join(slow, cls))
            for i in range(per_class):
                with open(os.path.join(slow, cls, f"{i}.jpg"), "wb") as f:
                    f.write(big_jpeg(4096))
        return slow

    def packed(self):
        """OUT with good train and val splits."""
        for split in ("train", "val"):
            code, err = run(self.src, self.out, "--split", split, "--images-per-shard", "4", "--quiet")
            self.assertEqual(code, 0, err)
        return snapshot(self.out)

    def assert_refused(self, args, code, message, before=None, **kw):
        """hpcdata pack ARGS exits CODE, its last line names the problem, and neither SRC nor OUT
        (nor the folder around them) changed."""
        before = before if before is not None else snapshot(self.tmp)
        got, err = run(*args, **kw)
        self.assertEqual(got, code, err)
        self.assertIn(message, err.strip().splitlines()[-1], err)
        self.assertEqual(len(error_lines(err)), 1, err)
        self.assertEqual(snapshot(self.tmp), before, "a refused packing changed files")

    def test_folder_becomes_shards(self):
        code, err = run(self.src, self.out, "--images-per-shard", "4", "--threads", "2")
        self.assertEqual(code, 0, err)
        self.assertIn("9 images of 3 classes in 3 shards", err)
        self.assertEqual(self.shards(), [f"train-g1-0000{i}-of-00003.hpcs" for i in range(3)])
        with open(os.path.join(self.out, "classes.txt")) as f:
            self.assertEqual(f.read().split(), self.CLASSES)
        manifest = self.manifest()
        self.assertEqual((manifest["images"], manifest["shards"], manifest["classes"]), (9, 3, 3))
        self.assertEqual(manifest["skipped"], [])
        self.assertEqual(manifest["class_names"], self.CLASSES)
        self.assertEqual([s["name"] for s in manifest["shard_files"]], self.shards())
        # The val split beside it, with the same classes (SRC spelled otherwise: "src/", which the
        # manifest recorded as typed, and hpctrain did not see as train's folder).
        code, err = run(self.src + os.sep, self.out, "--split", "val", "--resize", "4")
        self.assertEqual(code, 0, err)
        self.assertIn("val-g1-00000-of-00001.hpcs", self.shards())
        # Packing a split again replaces its shards: only the new ones stay.
        code, err = run(self.src, self.out, "--images-per-shard", "5", "--quiet")
        self.assertEqual(code, 0, err)
        self.assertEqual(self.shards(), ["train-g2-00000-of-00002.hpcs", "train-g2-00001-of-00002.hpcs",
                                         "val-g1-00000-of-00001.hpcs"])
        # hpctrain trains on them: random resized crops of the JPEGs, decoded in its loader.
        if HPCTRAIN:
            code, out, err = hpctrain(self.out, self.tmp)
            self.assertEqual(code, 0, out + err)
            self.assertIn("data: shards from", out)
            self.assertIn("(9 train, 9 test)", out)
            # Both splits from one folder: the accuracy is on training images, said once.
            warning = (f"hpctrain: warning: the val split in {self.out} was packed from the same image folder as "
                       f"train ({os.path.realpath(self.src)}): the test accuracy is measured on training images")
            self.assertEqual((out + err).count(warning), 1, out + err)
            self.assertEqual(self.manifest("val")["source"], os.path.realpath(self.src))
            # A manifest written before, with the folder as typed: the same folder all the same.
            val = self.manifest("val")
            val["source"] = os.path.join(self.tmp, ".", os.path.relpath(self.src, self.tmp)) + os.sep
            with open(os.path.join(self.out, "val.json"), "w") as f:
                json.dump(val, f)
            code, out, err = hpctrain(self.out, self.tmp)
            self.assertEqual((code, (out + err).count(warning)), (0, 1), out + err)
            other = os.path.join(self.tmp, "other-val")
            shutil.copytree(self.src, other)
            self.assertEqual(run(other, self.out, "--split", "val", "--quiet")[0], 0)
            code, out, err = hpctrain(self.out, self.tmp)
            self.assertEqual(code, 0, out + err)
            self.assertNotIn("packed from the same image folder", out + err)

    def test_an_out_others_may_write_to_is_refused(self):
        """An OUT every user may write to (another user's 777 in /tmp) is refused as hpctrain's
        checkpoint directory is: they could swap the shards once packed. Exit 2, one line."""
        os.makedirs(self.out)
        os.chmod(self.out, 0o777)
        self.assert_refused([self.src, self.out], 2, f"OUT {self.out}: it is writable by others (mode 777)")
        os.chmod(self.out, 0o775)  # a team's: its group may write
        code, err = run(self.src, self.out, "--quiet")
        self.assertEqual(code, 0, err)

    def test_an_out_in_a_folder_others_may_write_to_is_refused(self):
        """An OUT, there or to be made, in a folder every user may write to that is not sticky: they
        could rename OUT away once packed and put shards of their own in its place. Refused as one
        that is there was, exit 2, one line, before anything is read or made (a creatable OUT was
        packed into); a sticky folder (as /tmp) or a team's (group write) is fine."""
        folder = os.path.join(self.tmp, "open")
        os.makedirs(os.path.join(folder, "there"))
        os.chmod(folder, 0o777)
        for out in (os.path.join(folder, "out"), os.path.join(folder, "new", "out"), os.path.join(folder, "there")):
            self.assert_refused([self.src, out], 2, f"OUT {out}: {folder} is writable by others (mode 777)")
        for mode in (0o1777, 0o775):
            os.chmod(folder, mode)
            code, err = run(self.src, os.path.join(folder, f"out-{mode:o}"), "--quiet")
            self.assertEqual(code, 0, err)

    def test_corrupt_image_fails_or_is_skipped(self):
        bad = os.path.join(self.src, "n01443537", "n01443537_1.JPEG")
        with open(bad, "wb") as f:
            f.write(JPEGS[0][: len(JPEGS[0]) // 2])
        self.assert_refused((self.src, self.out, "--quiet"), 1, bad)
        self.assertFalse(os.path.exists(self.out), "a failed first packing leaves no OUT behind")
        code, err = run(self.src, self.out, "--skip-corrupt", "--quiet")
        self.assertEqual(code, 0, err)
        self.assertIn("1 images skipped", err)
        self.assertEqual((self.manifest()["images"], self.manifest()["skipped"]), (8, [bad]))
        # Nothing left to pack once every image is skipped: an error, and the split stays.
        broken = os.path.join(self.tmp, "broken")
        self.folder(broken, self.CLASSES, per_class=1)
        for cls in self.CLASSES:
            with open(os.path.join(broken, cls, f"{cls}_0.JPEG"), "wb") as f:
                f.write(b"\xff\xd8 not really")
        self.assert_refused((broken, self.out, "--skip-corrupt", "--quiet"), 1, "none of the 3 images")

    def test_failed_repack_keeps_the_good_shards(self):
        """Issue 20: a file that is not a JPEG among the images deleted the packed train shards
        while train.json still listed them."""
        before = self.packed()
        bad = os.path.join(self.src, "n01484850", "scan.jpg")
        with open(bad, "wb") as f:
            f.write(b"%PDF-1.4 not a picture\n")
        self.assert_refused((self.src, self.out, "--quiet", "--images-per-shard", "2"), 1, bad)
        self.assertEqual(snapshot(self.out), before)
        if HPCTRAIN:  # still whole: hpctrain trains on the old set
            code, out, err = hpctrain(self.out, self.tmp)
            self.assertEqual(code, 0, out + err)
        # A failed packing leaves no classes.txt to block the next one: the only split may
        # change its classes (with val present they must stay those of val).
        shutil.rmtree(self.out)
        code, err = run(self.src, self.out, "--quiet")
        self.assertEqual(code, 1, err)
        self.assertFalse(os.path.exists(self.out))
        os.unlink(bad)
        other = os.path.join(self.tmp, "other")
        self.folder(other, ["cat", "dog"])
        self.assertEqual(run(self.src, self.out, "--quiet")[0], 0)
        code, err = run(other, self.out, "--quiet")
        self.assertEqual(code, 0, err)
        with open(os.path.join(self.out, "classes.txt")) as f:
            self.assertEqual(f.read().split(), ["cat", "dog"])
        self.assertEqual(run(other, self.out, "--split", "val", "--quiet")[0], 0)
        self.assert_refused((self.src, self.out, "--quiet"), 1, "differ from the 3 class folders")

    def test_linked_folders(self):
        """A class folder behind a link that leads nowhere was left out, and every later class's
        label shifted; a linked folder inside a class was passed over, counted nowhere."""
        extra = os.path.join(self.tmp, "extra")
        self.folder(extra, ["more"], per_class=5)
        os.symlink(os.path.join(extra, "more"), os.path.join(self.src, self.CLASSES[0], "more"))
        code, err = run(self.src, self.out, "--quiet")
        self.assertEqual(code, 0, err)
        self.assertEqual(self.manifest()["images"], 9 + 5)
        gone = os.path.join(self.src, "a-gone")
        os.symlink(os.path.join(self.tmp, "not-mounted"), gone)
        before = snapshot(self.out)
        code, err = run(self.src, self.out, "--quiet")
        self.assertEqual(code, 1, err)
        self.assertEqual(error_lines(err), [f"hpcdata pack: error: {gone} is a link to {self.tmp}/not-mounted, which "
                                            "does not exist: mount or mend it, or remove it"])
        self.assertEqual(snapshot(self.out), before)
        os.remove(gone)
        # A link back to the folder of all classes packed the other classes' images under this
        # one's label, again at every turn, until the kernel's 40 links ended it with a path
        # 40 folders deep; one over two links came back the same way.
        up = os.path.join(self.src, self.CLASSES[1], "up")
        os.symlink(self.src, up)
        self.assert_refused((self.src, self.out, "--quiet"), 1,
                            f"{up} leads back to {os.path.realpath(self.src)}, a folder it lies in: a loop of links")
        os.remove(up)
        there = os.path.join(extra, "more", "back")
        os.symlink(os.path.join(self.src, self.CLASSES[0]), there)
        self.assert_refused((self.src, self.out, "--quiet"), 1,
                            f"{os.path.join(self.src, self.CLASSES[0], 'more', 'back')} leads back to "
                            f"{os.path.join(self.src, self.CLASSES[0])}, a folder it lies in")
        self.assertEqual(snapshot(self.out), before)

    def test_a_split_of_100000_shards_or_more_is_seen(self):
        """Shard names have six digits from 100000 shards on (ImageNet at 12 images a shard or
        fewer). The packing that followed did not see them: it took their generation, wrote its
        shards under their names, and when it failed removed them all, the committed split's."""
        self.packed()
        stray = os.path.join(self.out, "train-g7-000000-of-100000.hpcs")
        open(stray, "w").close()
        code, err = run(self.src, self.out, "--quiet")
        self.assertEqual(code, 0, err)
        self.assertEqual(self.manifest()["generation"], 8)
        self.assertFalse(os.path.exists(stray), "a replaced generation's shard is left")

    @unittest.skipUnless(HPCTRAIN, "HPCTRAIN (the hpctrain binary) is not set")
    def test_a_split_of_more_shards_than_the_soft_open_file_limit_trains(self):
        """hpctrain holds every shard open: ImageNet's 1301 at the default 1024 images a shard
        passed the soft limit of 1024 many logins have ("Too many open files"). The soft limit is
        raised to the hard one; where that is too low too, the error says what to raise."""
        code, err = run(self.src, self.out, "--images-per-shard", "1", "--quiet")
        self.assertEqual(code, 0, err)
        code, err = run(self.src, self.out, "--split", "val", "--images-per-shard", "1", "--quiet")
        self.assertEqual(code, 0, err)
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        for soft, limit, ok in ((16, hard, True), (16, 16, False)):
            with self.subTest(soft=soft, hard=limit):
                def limited(soft=soft, limit=limit):
                    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, limit))
                p = subprocess.run([HPCTRAIN, "--dataset", "shards", "--data-dir", self.out, "--image-size", "16",
                                    "--model", "cnn", "--max-steps", "2", "--batch-size", "4", "--threads", "1"],
                                   cwd=self.tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120,
                                   preexec_fn=limited)
                if ok:
                    self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
                else:
                    self.assertEqual(p.returncode, 2, p.stderr)
                    self.assertIn("Too many open files (this process may hold 16 open at once, as raised to its hard "
                                  "limit: raise that, ulimit -Hn, or pack fewer, larger shards)", p.stderr)

    def test_signal_part_way_leaves_out_as_it_was(self):
        before = self.packed()
        slow = self.slow_folder(4)
        job = subprocess.Popen([sys.executable, HPCDATA, "pack", slow, self.out, "--threads", "1", "--quiet"],
                               stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not any(n.endswith(".part") for n in os.listdir(self.out)):  # a new shard is being written
            self.assertIsNone(job.poll(), "the packing ended before it could be stopped")
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.005)
        job.send_signal(signal.SIGTERM)
        _, err = job.communicate(timeout=60)
        self.assertEqual(job.returncode, 128 + signal.SIGTERM, err)
        self.assertIn("stopped by SIGTERM", err.strip().splitlines()[-1])
        self.assertEqual(snapshot(self.out), before)

    def test_a_reader_gone_does_not_stop_the_packing(self):
        """The installed packer run by itself, its progress read by `| head -1`: killed by SIGPIPE
        when the reader went, it left finished shards, a .part file and a new OUT behind."""
        slow = self.slow_folder(2)
        job = subprocess.Popen([os.environ["HPCDATA_PACK"], slow, self.out, "--threads", "1", "--images-per-shard", "1",
                                "--progress", "lines"], stderr=subprocess.PIPE)  # SIGPIPE as a shell leaves it
        job.stderr.readline()
        job.stderr.close()  # the reader goes
        self.assertEqual(job.wait(timeout=120), 0)
        self.assertEqual(self.manifest()["images"], 6)
        self.assertFalse([n for n in os.listdir(self.out) if n.endswith(".part")])

    def test_interrupt_before_the_packer_runs_is_one_line(self):
        """Ctrl-C while hpcdata loads its modules, before the packer takes its place (a
        KeyboardInterrupt traceback before): status 130 and one line, OUT never made. The signal
        goes as the script's own imports begin, seen in -X importtime's lines."""
        status, err = interrupted_as_imports_begin([HPCDATA, "pack", self.src, self.out, "--quiet"])
        self.assertEqual(status, 128 + signal.SIGINT, err)
        self.assertEqual(err.splitlines(), ["hpcdata: stopped by SIGINT before finishing"])
        self.assertFalse(os.path.exists(self.out), "an interrupted pack made OUT")

    def test_full_disk_leaves_out_as_it_was(self):
        before = self.packed()
        big = os.path.join(self.src, "n01440764", "big.jpg")
        with open(big, "wb") as f:
            f.write(big_jpeg(256) + bytes(20000))  # bytes after the end of the image are ignored by decoders

        def small_files():  # a file system with 10 kB left, as the packer sees it
            resource.setrlimit(resource.RLIMIT_FSIZE, (10000, 10000))
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        # One image a shard, one at a time: shards finished before the big one must go too.
        got, err = run(self.src, self.out, "--quiet", "--images-per-shard", "1", "--threads", "1",
                       preexec_fn=small_files)
        self.assertEqual(got, 1, err)
        self.assertIn("cannot write", err.strip().splitlines()[-1])
        self.assertEqual(snapshot(self.out), before)

    def test_version_is_hpctrains(self):
        """hpcdata --version: the project's version, as its hpcdata-pack was built with it; a packer
        that cannot say it is one error line and exit 1."""
        p = subprocess.run([sys.executable, HPCDATA, "--version"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, timeout=60)
        self.assertEqual((p.returncode, p.stdout, p.stderr), (0, f"hpcdata {os.environ['HPCTRAIN_VERSION']}\n", ""))
        p = subprocess.run([sys.executable, HPCDATA, "--version"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, timeout=60, env={**os.environ, "HPCDATA_PACK": "/bin/false"})
        self.assertEqual(p.returncode, 1)
        self.assertEqual(len(p.stderr.splitlines()), 1, p.stderr)
        self.assertIn("hpcdata: error: /bin/false --version failed", p.stderr)

    def test_help_and_version_that_cannot_be_written_are_an_error(self):
        """`> file` on a full disk (/dev/full): hpcdata's --help ended 0 with nothing written (argparse
        passes over the failed write), its --version 1 with "hpcdata: error: : No space left on
        device", hpcdata-pack's 0. Now one line naming the problem, exit 2."""
        for args in (["--help"], ["--version"], ["prepare", "--help"], ["pack", "--help"], ["pack", "--version"]):
            with self.subTest(args=args), open("/dev/full", "w") as full:
                p = subprocess.run([sys.executable, HPCDATA, *args], stdout=full, stderr=subprocess.PIPE, text=True,
                                   timeout=60)
                prog = "hpcdata pack" if args[0] == "pack" else "hpcdata"
                self.assertEqual((p.returncode, p.stderr.splitlines()),
                                 (2, [f"{prog}: error: cannot write the results to standard output: "
                                      "No space left on device"]))
        # A reader gone (a pipe's read end closed) has read what it wanted of --help and --version:
        # exit 0 and nothing said, as hpctrain's.
        for args in (["--help"], ["--version"]):
            r, w = os.pipe()
            os.close(r)
            p = subprocess.run([sys.executable, HPCDATA, *args], stdout=w, stderr=subprocess.PIPE, text=True,
                               timeout=60)
            os.close(w)
            self.assertEqual((p.returncode, p.stderr), (0, ""), args)
        # Started with stdout closed (`>&-`): Python's sys.stdout is None (print() passed over it).
        p = subprocess.run(["/bin/sh", "-c", 'exec "$@" >&-', "sh", sys.executable, HPCDATA, "--version"],
                           stderr=subprocess.PIPE, text=True, timeout=60)
        self.assertEqual((p.returncode, p.stderr),
                         (2, "hpcdata: error: cannot write the results to standard output: it is closed\n"))

    def test_hpcdata_pack_must_be_a_packer(self):
        """An HPCDATA_PACK that is set names the packer: one that is missing, a directory or not
        executable is a usage error naming it (no quiet fall back to another packer)."""
        self.packed()
        a_file = os.path.join(self.tmp, "not-executable")
        with open(a_file, "w") as f:
            f.write("#!/bin/sh\n")
        for packer, problem in ((os.path.join(self.tmp, "nowhere"), "does not exist"), (self.tmp, "is a directory"),
                                (a_file, "is not an executable file")):
            env = dict(os.environ, HPCDATA_PACK=packer)
            with self.subTest(packer=packer):
                self.assert_refused((self.src, self.out), 2, f"HPCDATA_PACK={packer} {problem}", env=env)
                p = subprocess.run([sys.executable, HPCDATA, "--version"], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, timeout=60, env=env)
                self.assertEqual((p.returncode, p.stdout), (2, ""), p.stderr)
                self.assertEqual(p.stderr.splitlines(), [f"hpcdata: error: HPCDATA_PACK={packer} {problem}: set it "
                                                         "to the built hpcdata-pack (build/datasets/hpcdata-pack), "
                                                         "or unset it"])

    def test_help_names_every_command_with_the_output_options(self):
        """hpcdata --help (and the man page made from it) names the commands that take --progress
        and --log-timestamps: exactly those whose own --help lists both."""
        help_text = subprocess.run([sys.executable, HPCDATA, "--help"], stdout=subprocess.PIPE, text=True,
                                   timeout=60).stdout
        named = re.search(r"^ *(.*) also take --progress", help_text, re.M)
        self.assertIsNotNone(named, help_text)
        named = set(re.findall(r"[a-z]+", named[1])) - {"and"}
        taking = set()
        for command in ("prepare", "pack", "stage"):
            own = subprocess.run([sys.executable, HPCDATA, command, "--help"], stdout=subprocess.PIPE, text=True,
                                 timeout=60).stdout
            if "--progress" in own and "--log-timestamps" in own:
                taking.add(command)
        self.assertEqual(named, taking)
        self.assertEqual(taking, {"prepare", "pack", "stage"})

    def test_bad_input_is_one_line_and_changes_nothing(self):
        self.packed()
        empty_class = os.path.join(self.tmp, "empty-class")
        self.folder(empty_class, ["a"])
        os.makedirs(os.path.join(empty_class, "b"))
        texts = os.path.join(self.tmp, "texts")
        os.makedirs(os.path.join(texts, "a"))
        with open(os.path.join(texts, "a", "notes.txt"), "w") as f:
            f.write("hi")
        os.makedirs(os.path.join(self.tmp, "empty"))
        a_file = os.path.join(self.tmp, "a-file")
        with open(a_file, "w") as f:
            f.write("x")
        empty_jpeg = os.path.join(self.tmp, "empty-jpeg")
        self.folder(empty_jpeg, self.CLASSES)
        open(os.path.join(empty_jpeg, self.CLASSES[0], "zero.jpg"), "w").close()
        loop = os.path.join(self.tmp, "loop")  # a link to itself
        os.symlink("loop", loop)
        link = os.path.join(self.tmp, "src-link")  # SRC by another name
        os.symlink(self.src, link)
        line_break = os.path.join(self.tmp, "line-break")
        self.folder(line_break, ["a", "b\nc"])
        latin1 = os.path.join(self.tmp, "latin-1")  # a name from another system's encoding: bytes, not UTF-8
        self.folder(latin1, ["a"])
        os.makedirs(os.path.join(os.fsencode(latin1), b"caf\xe9"))
        with open(os.path.join(os.fsencode(latin1), b"caf\xe9", b"cafe_0.JPEG"), "wb") as f:
            f.write(JPEGS[0])
        prepared = os.path.join(self.tmp, "prepared")
        os.makedirs(prepared)
        with open(os.path.join(prepared, "hpcdata.json"), "w") as f:
            json.dump({"dataset": "fashion-mnist", "files": {}}, f)
        strays = []  # OUTs with a shard file of no packing's: past int64_t, and at its end (no next)
        for g in ("99999999999999999999", "9223372036854775807"):
            strays.append(os.path.join(self.tmp, "stray-g" + g))
            os.makedirs(strays[-1])
            open(os.path.join(strays[-1], f"train-g{g}-00000-of-00001.hpcs"), "w").close()
        cases = [((empty_jpeg, self.out), 1, "zero.jpg is empty, not a JPEG image"),
                 ((line_break, self.out), 1, "class folder name 'b\\nc' holds a line break"),  # one line, as all
                 ((latin1, self.out), 1, "class folder name 'caf\\xe9' is not UTF-8 text"),
                 # A folder hpcdata prepare made: with its hpcdata.json, hpctrain took it for that
                 # dataset, and the shards packed beside it no longer trained.
                 ((self.src, prepared), 2, f"output directory {prepared} holds a dataset hpcdata prepare made "
                                           "(its hpcdata.json): pack into another directory"),
                 ((self.src, strays[0]), 1, "has a generation past any hpcdata writes"),
                 ((self.src, strays[1]), 1, "has a generation past any hpcdata writes"),((empty_class, self.out), 1, "has no JPEG images"),
                 ((texts, self.out), 1, "has no JPEG images"),
                 ((os.path.join(self.tmp, "empty"), self.out), 1, "has no class folders"),
                 ((os.path.join(self.tmp, "nowhere"), self.out), 2, "does not exist"),
                 ((a_file, self.out), 2, "is not a directory"),
                 ((self.src, self.src), 2, "is the image folder itself"),
                 ((self.src, link), 2, "is the image folder itself"),
                 ((self.src, os.path.join(self.src, "n01440764", "packed")), 2, "inside the image folder"),
                 ((self.src, a_file), 2, "exists and is not a directory"),
                 # Paths that can never be a directory: refused as a file there is, before the scan
                 # (exit 1, "cannot create", after it before).
                 ((self.src, os.path.join(a_file, "out")), 2, "out cannot be made or used: Not a directory"),
                 ((self.src, os.path.join(loop, "out")), 2, "cannot be made or used: Too many levels of symbolic"),
                 ((self.src, os.path.join(self.tmp, "n" * 256, "out")), 2, "cannot be made or used: File name too long"),
                 (("", self.out), 2, "SRC is an empty path"),
                 ((self.src, ""), 2, "OUT is an empty path"),
                 ((self.src,), 2, "are needed"),
                 ((self.src, self.out, "--images-per-shard", "0"), 2, "must be positive"),
                 # The shard count overflowed, and it crashed (SIGSEGV) leaving a new, empty OUT.
                 ((self.src, self.out, "--images-per-shard", "9223372036854775807"), 2, "at most 4294967295"),
                 ((self.src, self.out, "--threads", "0"), 2, "1..1024"),
                 ((self.src, self.out, "--threads", "100000"), 2, "1..1024"),
                 ((self.src, self.out, "--quality", "101"), 2, "1..100"),
                 ((self.src, self.out, "--resize", "-1"), 2, "0 or positive"),
                 ((self.src, self.out, "--seed", "x"), 2, "--seed must be a whole number"),
                 ((self.src, self.out, "--seed", "-1"), 2, "--seed must be a whole number from 0 to"),
                 ((self.src, self.out, "--seed", "18446744073709551616"), 2, "got '18446744073709551616'"),
                 ((self.src, self.out, "--bogus"), 2, "unrecognised option"),
                 # Options are named whole (Boost's guessing took --res for --resize).
                 ((self.src, self.out, "--res", "32"), 2, "unrecognised option '--res' (options are named whole: --resize?)"),
                 ((self.src, self.out, "--split", "a/b"), 2, "choose --split train or --split val"),
                 # hpctrain reads train and val only: a test split would be packed for nobody.
                 ((self.src, self.out, "--split", "test"), 2, "--split test is not a split hpctrain reads"),
                 # "$UNSET/": the root directory, by any spelling, is never OUT.
                 ((self.src, "/"), 2, "OUT / is the root directory / (an unset variable?)"),
                 ((self.src, "//"), 2, "OUT // is the root directory /"),
                 ((self.src, "/tmp/.."), 2, "is the root directory /")]
        for args, want, message in cases:
            with self.subTest(args=args):
                self.assert_refused(args, want, message)
        # Another packing of the same OUT in progress (it holds OUT's lock).
        fd = os.open(self.out, os.O_RDONLY)
        self.addCleanup(os.close, fd)
        fcntl.flock(fd, fcntl.LOCK_EX)
        self.assert_refused((self.src, self.out), 1, "another hpcdata pack is writing into")

    @unittest.skipUnless(HPCTRAIN, "HPCTRAIN (the hpctrain binary) is not set")
    def test_broken_shards_are_refused_by_hpctrain(self):
        """Shards damaged, lost or mixed up after packing: hpctrain exits 2 naming the problem,
        and reads nothing it should not (nothing in OUT changes)."""
        self.packed()
        other = os.path.join(self.tmp, "other")
        self.folder(other, ["cat", "dog"], per_class=5)
        other_out = os.path.join(self.tmp, "other-out")
        self.assertEqual(run(other, other_out, "--split", "val", "--images-per-shard", "4", "--quiet")[0], 0)
        first = os.path.join(self.out, "train-g1-00000-of-00003.hpcs")

        def truncate(path=first):
            with open(path, "r+b") as f:
                f.truncate(os.path.getsize(path) - 5)

        def overwrite_index():
            with open(first, "r+b") as f:
                f.seek(-30, os.SEEK_END)
                f.write(b"\xff\xff")

        def flip_record_bit():  # one bit inside a val record: a JPEG that may well decode, into another image
            path = os.path.join(self.out, "val-g1-00000-of-00003.hpcs")
            with open(path, "r+b") as f:
                f.seek(8 + 200)
                b = f.read(1)
                f.seek(8 + 200)
                f.write(bytes([b[0] ^ 0x10]))

        def foreign_shard():  # another packing's shard under this one's name
            shutil.copyfile(os.path.join(other_out, "val-g1-00000-of-00003.hpcs"), first)

        def rewrite(split, change):
            path = os.path.join(self.out, f"{split}.json")
            with open(path) as f:
                text = f.read()
            with open(path, "w") as f:
                f.write(change(text))

        def replace_val():  # a val split from another dataset
            for n in os.listdir(self.out):
                if n.startswith("val"):
                    os.unlink(os.path.join(self.out, n))
            for n in os.listdir(other_out):
                if n.startswith("val"):
                    shutil.copyfile(os.path.join(other_out, n), os.path.join(self.out, n))

        cases = [(truncate, "has no index at its end"),
                 (overwrite_index, "corrupt index"),
                 (flip_record_bit, "val-g1-00000-of-00003.hpcs record 0 is damaged"),
                 (foreign_shard, "train-g1-00000-of-00003.hpcs is"),
                 (lambda: os.unlink(os.path.join(self.out, "train-g1-00001-of-00003.hpcs")),
                  "lists train-g1-00001-of-00003.hpcs, which is missing"),
                 (lambda: rewrite("train", lambda t: t[: len(t) // 2]), "is not a packed split's manifest"),
                 (lambda: rewrite("train", lambda t: "[1, 2]"), "is not the manifest of the packed split 'train'"),
                 (lambda: rewrite("train", lambda t: t.replace('"split": "train"', '"split": "val"')),
                  "is not the manifest of the packed split 'train'"),
                 (lambda: rewrite("train", lambda t: t.replace('"images": 9', '"images": 10')),
                  "counts 10 images but its shards hold 9"),
                 (lambda: rewrite("train", lambda t: t.replace("shard_files", "files")), "(no shard_files)"),
                 (lambda: rewrite("train", lambda t: t.replace('"name": "train-g1', '"name": "../train-g1')),
                  "which is no shard file name"),
                 (lambda: os.unlink(os.path.join(self.out, "val.json")), "val.json is missing, but 3 val shard(s) are in"),
                 (replace_val, "have different classes (3 and 2)"),
                 (lambda: rewrite("val", lambda t: t.replace('"n01443537"', '"n01443538"')),
                  "have different classes (class 1 is 'n01443537' and 'n01443538')")]
        pristine = os.path.join(self.tmp, "pristine")
        shutil.copytree(self.out, pristine)
        for damage, message in cases:
            with self.subTest(message=message):
                shutil.rmtree(self.out)
                shutil.copytree(pristine, self.out)
                damage()
                before = snapshot(self.out)
                code, out, err = hpctrain(self.out, self.tmp)
                self.assertEqual(code, 2, out + err)
                self.assertIn(message, err.strip().splitlines()[-1], err)
                self.assertEqual(snapshot(self.out), before)
        # classes.txt is for people: hpctrain goes by the manifests, so a renamed class changes nothing.
        shutil.rmtree(self.out)
        shutil.copytree(pristine, self.out)
        with open(os.path.join(self.out, "classes.txt"), "w") as f:
            f.write("tench\ngoldfish\n")
        code, out, err = hpctrain(self.out, self.tmp)
        self.assertEqual(code, 0, out + err)


if __name__ == "__main__":
    unittest.main()

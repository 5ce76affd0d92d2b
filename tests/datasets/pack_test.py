"""hpcdata pack from the command line (the packer's library is tested in depth by
tests/unit/shards_test.cpp): a folder of real JPEGs becomes shards, classes.txt and train.json;
corrupt images fail naming the file, or are skipped and listed with --skip-corrupt; an empty
class folder, a missing folder and bad options are one error line with the documented exit
code, and a failed packing leaves no shards."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
HPCDATA = os.path.join(HERE, "..", "..", "datasets", "hpcdata")
if not os.environ.get("HPCDATA_PACK"):
    print("SKIPPED: HPCDATA_PACK (the built hpcdata-pack) is not set")
    sys.exit(77)

# Two small JPEGs (8x8 and 16x8, made with libjpeg-turbo).
JPEGS = [bytes.fromhex("ffd8ffe000104a46494600010100000100010000ffdb00430006040506050406060506070706080a100a0a09090a140e0f0c1017141818171416161a1d251f1a1b231c1616202c20232627292a29191f2d302d283025282928ffdb0043010707070a080a130a0a13281a161a2828282828282828282828282828282828282828282828282828282828282828282828282828282828282828282828282828ffc00011080008000803012200021101031101ffc4001f0000010501010101010100000000000000000102030405060708090a0bffc400b5100002010303020403050504040000017d01020300041105122131410613516107227114328191a1082342b1c11552d1f02433627282090a161718191a25262728292a3435363738393a434445464748494a535455565758595a636465666768696a737475767778797a838485868788898a92939495969798999aa2a3a4a5a6a7a8a9aab2b3b4b5b6b7b8b9bac2c3c4c5c6c7c8c9cad2d3d4d5d6d7d8d9dae1e2e3e4e5e6e7e8e9eaf1f2f3f4f5f6f7f8f9faffc4001f0100030101010101010101010000000000000102030405060708090a0bffc400b51100020102040403040705040400010277000102031104052131061241510761711322328108144291a1b1c109233352f0156272d10a162434e125f11718191a262728292a35363738393a434445464748494a535455565758595a636465666768696a737475767778797a82838485868788898a92939495969798999aa2a3a4a5a6a7a8a9aab2b3b4b5b6b7b8b9bac2c3c4c5c6c7c8c9cad2d3d4d5d6d7d8d9dae2e3e4e5e6e7e8e9eaf2f3f4f5f6f7f8f9faffda000c03010002110311003f00a9159dae93e21dba6da5a3d94c04b12dbdb43208c1eabfbab79f6e0f4dd216239a28a2aa3b0eaa4a5a765f91ffd9"),
         bytes.fromhex("ffd8ffe000104a46494600010100000100010000ffdb00430006040506050406060506070706080a100a0a09090a140e0f0c1017141818171416161a1d251f1a1b231c1616202c20232627292a29191f2d302d283025282928ffdb0043010707070a080a130a0a13281a161a2828282828282828282828282828282828282828282828282828282828282828282828282828282828282828282828282828ffc00011080010000803012200021101031101ffc4001f0000010501010101010100000000000000000102030405060708090a0bffc400b5100002010303020403050504040000017d01020300041105122131410613516107227114328191a1082342b1c11552d1f02433627282090a161718191a25262728292a3435363738393a434445464748494a535455565758595a636465666768696a737475767778797a838485868788898a92939495969798999aa2a3a4a5a6a7a8a9aab2b3b4b5b6b7b8b9bac2c3c4c5c6c7c8c9cad2d3d4d5d6d7d8d9dae1e2e3e4e5e6e7e8e9eaf1f2f3f4f5f6f7f8f9faffc4001f0100030101010101010101010000000000000102030405060708090a0bffc400b51100020102040403040705040400010277000102031104052131061241510761711322328108144291a1b1c109233352f0156272d10a162434e125f11718191a262728292a35363738393a434445464748494a535455565758595a636465666768696a737475767778797a82838485868788898a92939495969798999aa2a3a4a5a6a7a8a9aab2b3b4b5b6b7b8b9bac2c3c4c5c6c7c8c9cad2d3d4d5d6d7d8d9dae2e3e4e5e6e7e8e9eaf2f3f4f5f6f7f8f9faffda000c03010002110311003f00935e4b84d2adb58b54b9b65b5c24fb166810213c31c2dac6304e096624e4014543a05aa596a175a635b89a15263135bdba12c847043c366ca1b047dc73b4f19c8a284db578eccd23eca4bf78da6bb24ff55ff0c7ffd9")]


def run(*args):
    p = subprocess.run([sys.executable, HPCDATA, "pack", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=120)
    return p.returncode, p.stderr


def error_lines(err):
    return [line for line in err.splitlines() if "error:" in line]


class Pack(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="hpcdata-pack-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.src = os.path.join(self.tmp, "src")
        self.out = os.path.join(self.tmp, "out")
        for c, cls in enumerate(["n01440764", "n01443537", "n01484850"]):
            os.makedirs(os.path.join(self.src, cls))
            for i in range(3):
                with open(os.path.join(self.src, cls, f"{cls}_{i}.JPEG"), "wb") as f:
                    f.write(JPEGS[(c + i) % 2])

    def shards(self):
        return sorted(n for n in os.listdir(self.out) if n.endswith(".hpcs")) if os.path.isdir(self.out) else []

    def test_folder_becomes_shards(self):
        code, err = run(self.src, self.out, "--images-per-shard", "4", "--threads", "2")
        self.assertEqual(code, 0, err)
        self.assertIn("9 images of 3 classes in 3 shards", err)
        self.assertEqual(self.shards(), [f"train-0000{i}-of-00003.hpcs" for i in range(3)])
        with open(os.path.join(self.out, "classes.txt")) as f:
            self.assertEqual(f.read().split(), ["n01440764", "n01443537", "n01484850"])
        with open(os.path.join(self.out, "train.json")) as f:
            manifest = json.load(f)
        self.assertEqual((manifest["images"], manifest["shards"], manifest["classes"]), (9, 3, 3))
        self.assertEqual(manifest["skipped"], [])
        # The val split beside it, with the same classes.
        code, err = run(self.src, self.out, "--split", "val", "--resize", "4")
        self.assertEqual(code, 0, err)
        self.assertIn("val-00000-of-00001.hpcs", self.shards())
        # hpctrain trains on them: random resized crops of the JPEGs, decoded in its loader.
        if os.environ.get("HPCTRAIN"):
            p = subprocess.run([os.environ["HPCTRAIN"], "--dataset", "shards", "--data-dir", self.out, "--image-size", "16",
                                "--model", "cnn", "--max-steps", "3", "--batch-size", "4", "--threads", "2"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
            self.assertEqual(p.returncode, 0, p.stdout)
            self.assertIn("data: shards from", p.stdout)
            self.assertIn("(9 train, 9 test)", p.stdout)

    def test_corrupt_image_fails_or_is_skipped(self):
        bad = os.path.join(self.src, "n01443537", "n01443537_1.JPEG")
        with open(bad, "wb") as f:
            f.write(JPEGS[0][: len(JPEGS[0]) // 2])
        code, err = run(self.src, self.out, "--quiet")
        self.assertEqual(code, 1)
        self.assertEqual(len(error_lines(err)), 1, err)
        self.assertIn(bad, err)
        self.assertEqual(self.shards(), [])
        code, err = run(self.src, self.out, "--skip-corrupt", "--quiet")
        self.assertEqual(code, 0, err)
        self.assertIn("1 images skipped", err)
        with open(os.path.join(self.out, "train.json")) as f:
            manifest = json.load(f)
        self.assertEqual((manifest["images"], manifest["skipped"]), (8, [bad]))

    def test_bad_input_is_one_line(self):
        os.makedirs(os.path.join(self.src, "n09999999"))
        cases = [((self.src, self.out), 1, "n09999999 has no JPEG images"),
                 ((os.path.join(self.tmp, "nowhere"), self.out), 1, "does not exist"),
                 ((self.src,), 2, "are needed"),
                 ((self.src, self.out, "--images-per-shard", "0"), 2, "must be positive"),
                 ((self.src, self.out, "--quality", "101"), 2, "1..100"),
                 ((self.src, self.out, "--bogus"), 2, "unrecognised option"),
                 ((self.src, self.out, "--split", "a/b"), 2, "plain word")]
        for args, want, message in cases:
            with self.subTest(args=args[2:] or args):
                code, err = run(*args)
                self.assertEqual(code, want, err)
                self.assertEqual(len(error_lines(err)), 1, err)
                self.assertIn(message, err)
        self.assertEqual(self.shards(), [])


if __name__ == "__main__":
    unittest.main()

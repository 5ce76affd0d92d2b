"""hpctrain export, checked by an independent runtime: for every model of the zoo, a checkpoint the
test trains is exported twice (batch norm as BatchNormalization nodes, and folded with
--fold-batch-norm); each file passes onnx.checker (Debian's python3-onnx) and, run by OpenCV's DNN
module (Debian's python3-opencv), gives on every image of the whole test set the logits hpctrain
gives (hpctrain predict --json --logits) within 1e-4 relative, the same class for every image, and
so the test accuracy `hpctrain evaluate` reports, to the last sample.

What "the whole test set" is, per model, to keep the test within seconds on two cores: mlp and cnn
run on the first 2000 of Fashion-MNIST's test images (Debian's dataset-fashion-mnist; evaluate is given
--test-samples 2000, so its accuracy is over the same images; all 10000 took a minute more of CI); resnet20 (32 pixels),
resnet18 (72 pixels: the ImageNet stem, torchvision's, its 3x3/2 max pool padded by 1) and resnet50
(16 pixels) on a small RGB dataset this test writes as JPEG files and packs into shards (hpcdata
pack), whose whole val split (the test set evaluate reads) is 24 images. That also covers three
channels, class names (recorded in the checkpoint: predict and export are given no --data-dir) and
evaluation's centre crop, which the numpy port below (centre_view) reproduces for OpenCV's input.
The variants without batch norm (cnn and resnet20, --no-batch-norm) are compared on the first 500
Fashion-MNIST test images."""

import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import cv2  # Debian's python3-opencv, python3-numpy and python3-onnx (setup.sh installs them)
import numpy as np
import onnx

HPCTRAIN = os.environ["HPCTRAIN"]
HPCDATA_PACK = os.environ["HPCDATA_PACK"]
FASHION_MNIST = os.environ.get("FASHION_MNIST", "/usr/share/datasets/fashion-mnist")
THREADS = "2"
RELATIVE = 1e-4  # the acceptance bound on the logits
FASHION_IMAGES = 2000  # the first test images mlp and cnn are compared on (of 10000)
cv2.setNumThreads(2)


def hpctrain(*args):
    p = subprocess.run([HPCTRAIN, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    if p.returncode != 0:
        raise AssertionError(f"hpctrain {' '.join(args)} exited {p.returncode}: {p.stderr}")
    return p.stdout


def idx(path, header):
    with gzip.open(path) as f:
        return np.frombuffer(f.read()[header:], np.uint8)


def centre_view(rgb, fraction, size):
    """data::centre_view in numpy, operation for operation in double: the centre crop of `fraction`
    of the shorter side, bilinear-resampled to size x size, rounded as hpctrain rounds."""
    h, w = rgb.shape[:2]
    side = min(h, w) * fraction
    y0, x0, step = (h - side) / 2, (w - side) / 2, side / size
    o = np.arange(size, dtype=np.float64)
    fy = np.clip(y0 + (o + 0.5) * step - 0.5, 0.0, h - 1)
    fx = np.clip(x0 + (o + 0.5) * step - 0.5, 0.0, w - 1)
    iy, ix = fy.astype(np.int64), fx.astype(np.int64)
    iy1, ix1 = np.minimum(iy + 1, h - 1), np.minimum(ix + 1, w - 1)
    wy, wx = (fy - iy)[:, None, None], (fx - ix)[None, :, None]
    p = rgb.astype(np.float64)
    v = ((1 - wy) * ((1 - wx) * p[iy][:, ix] + wx * p[iy][:, ix1])
         + wy * ((1 - wx) * p[iy1][:, ix] + wx * p[iy1][:, ix1]))
    return np.clip(v + 0.5, 0.0, 255.0).astype(np.uint8)


def opencv_logits(path, images):
    """OpenCV DNN's logits for NCHW float32 pixel values, in chunks."""
    net = cv2.dnn.readNetFromONNX(path)
    out = []
    for b in range(0, len(images), 500):
        net.setInput(np.ascontiguousarray(images[b:b + 500]))
        out.append(net.forward().copy())
    return np.concatenate(out)


class Export(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="hpctrain-onnx-")
        cls.fmnist = None
        cls.shards = None

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, True)

    # ---- the test sets -------------------------------------------------------------------------

    @classmethod
    def fashion_mnist(cls):
        """Fashion-MNIST's test set as the model takes it (N x 1 x 28 x 28), its labels, and the same
        images as PNG files for hpctrain predict."""
        if cls.fmnist is None:
            images = idx(os.path.join(FASHION_MNIST, "t10k-images-idx3-ubyte.gz"), 16).reshape(-1, 28, 28)
            labels = idx(os.path.join(FASHION_MNIST, "t10k-labels-idx1-ubyte.gz"), 8).astype(np.int64)
            images, labels = images[:FASHION_IMAGES], labels[:FASHION_IMAGES]
            folder = os.path.join(cls.tmp, "fashion-mnist-png")
            os.makedirs(folder)
            paths = [os.path.join(folder, f"{i:05d}.png") for i in range(len(images))]
            for path, image in zip(paths, images):
                cv2.imwrite(path, image)
            cls.fmnist = ("fashion-mnist", None, paths, images[:, None].astype(np.float32), labels, folder)
        return cls.fmnist

    @classmethod
    def packed_shards(cls):
        """A four-class RGB dataset of JPEGs of several sizes (each class its own colour and stripes,
        plus noise), packed into shards: train 48 images, val 24."""
        if cls.shards is None:
            rng = np.random.default_rng(7)
            src = {split: os.path.join(cls.tmp, f"src-{split}") for split in ("train", "val")}
            out = os.path.join(cls.tmp, "shards")
            classes = ["blue_squares", "green_columns", "grey_noise", "red_rows"]  # packed in sorted order
            for split, count in (("train", 12), ("val", 6)):
                for c, name in enumerate(classes):
                    os.makedirs(os.path.join(src[split], name))
                    for i in range(count):
                        h, w = rng.integers(36, 60, size=2)
                        y, x = np.mgrid[0:h, 0:w]
                        pattern = [((y // 6) + (x // 6)) % 2, (x // 4) % 2, np.zeros_like(y), (y // 4) % 2][c]
                        tint = np.arange(3) == [2, 1, 0, 0][c]  # blue, green, red, red
                        rgb = rng.integers(0, 90, size=(h, w, 3)) + 120 * pattern[..., None] * tint
                        cv2.imwrite(os.path.join(src[split], name, f"{i:02d}.jpg"),
                                    np.clip(rgb, 0, 255).astype(np.uint8)[..., ::-1], [cv2.IMWRITE_JPEG_QUALITY, 92])
                p = subprocess.run([HPCDATA_PACK, src[split], out, "--split", split, "--quiet"],
                                   stderr=subprocess.PIPE, text=True, timeout=120)
                assert p.returncode == 0, p.stderr
            paths, labels = [], []
            for c, name in enumerate(classes):
                for f in sorted(os.listdir(os.path.join(src["val"], name))):
                    paths.append(os.path.join(src["val"], name, f))
                    labels.append(c)
            cls.shards = (out, src["val"], paths, np.array(labels), classes)
        return cls.shards

    # ---- the check -----------------------------------------------------------------------------

    def train(self, name, *options):
        """A checkpoint of the model `name` names (up to a dash: "cnn-nobn" is a cnn)."""
        ck = os.path.join(self.tmp, f"ck-{name}")
        hpctrain("--model", name.split("-")[0], "--checkpoint-dir", ck, "--threads", THREADS, "--quiet",
                 "--device", "cpu", *options)
        return ck

    def export(self, ck, name, *options):
        path = os.path.join(self.tmp, name)
        out = hpctrain("export", "--checkpoint", ck, "--output", path, *options)
        self.assertIn(f"to {path}: ONNX opset 13", out)
        proto = onnx.load(path)
        onnx.checker.check_model(proto, full_check=True)
        return path, {p.key: p.value for p in proto.metadata_props}

    def predicted(self, ck, folder, paths, *options):
        """hpctrain predict's logits for every path, in the order of paths."""
        out = hpctrain("predict", "--checkpoint", ck, "--json", "--logits", "--top-k", "1", "--threads", THREADS,
                       "--device", "cpu", "--batch-size", "500", folder, *options)
        by_path = {r["path"]: r["logits"] for r in map(json.loads, out.splitlines())}
        self.assertEqual(sorted(by_path), sorted(paths))
        return np.array([by_path[p] for p in paths], dtype=np.float64)

    def evaluated_accuracy(self, ck, *options):
        metrics = os.path.join(self.tmp, "evaluate.jsonl")
        if os.path.exists(metrics):
            os.remove(metrics)
        hpctrain("evaluate", "--checkpoint", ck, "--threads", THREADS, "--metrics-file", metrics, *options)
        with open(metrics) as f:
            line = json.loads(f.readline())
        return line["test_accuracy"], line["samples"]

    def agree(self, ours, theirs, labels, evaluated, what):
        """Every image's logits within RELATIVE of the largest of its own, the same class for every
        image, and the same accuracy as hpctrain evaluate's, to the last sample."""
        scale = np.abs(ours).max(axis=1)
        worst = (np.abs(theirs - ours).max(axis=1) / scale).max()
        self.assertLessEqual(worst, RELATIVE, f"{what}: logits differ by {worst:.2e} of their scale")
        differ = np.flatnonzero(theirs.argmax(axis=1) != ours.argmax(axis=1))
        self.assertEqual(len(differ), 0, f"{what}: another class for images {differ[:10]}")
        accuracy, samples = evaluated
        self.assertEqual(samples, len(labels))
        self.assertEqual(int((theirs.argmax(axis=1) == labels).sum()), round(accuracy * samples), what)

    def check(self, model, ck, test_set, pixels, metadata):
        name, data_dir, paths, labels, folder = test_set
        ours = self.predicted(ck, folder, paths)  # the checkpoint names its classes: no --data-dir
        evaluated = self.evaluated_accuracy(ck, *(["--data-dir", data_dir] if data_dir else
                                                  ["--test-samples", str(len(paths))]))
        self.assertEqual(int((ours.argmax(axis=1) == labels).sum()), round(evaluated[0] * evaluated[1]),
                         "hpctrain predict and hpctrain evaluate disagree on the test set")
        # The checkpoint export reads: the newest valid one (inspect lists a directory newest first).
        inspected = next(r for r in map(json.loads, hpctrain("inspect", ck, "--json").splitlines())
                         if r.get("valid") == "yes")
        for fold in ([], ["--fold-batch-norm"]):
            path, meta = self.export(ck, f"{model}{'-folded' if fold else ''}.onnx", *fold)
            for key, value in metadata.items():
                self.assertEqual(meta[key], value, key)
            for key in ("state_checksum", "param_checksum", "step"):
                self.assertEqual(meta[key], str(inspected[key]), key)
            self.assertEqual(meta["batch_norm"].split()[0], "folded" if fold else "BatchNormalization")
            theirs = opencv_logits(path, pixels)
            self.agree(ours, theirs, labels, evaluated, f"{model}{' folded' if fold else ''}")

    def fashion_mnist_model(self, model):
        ck = self.train(model, "--train-samples", "1024", "--epochs", "1", "--test-samples", "64")
        name, _, paths, pixels, labels, folder = self.fashion_mnist()
        self.check(model, ck, (name, None, paths, labels, folder), pixels,
                   {"model": model, "dataset": "fashion-mnist", "input_channels": "1", "input_height": "28",
                    "mean": "0.286", "std": "0.353",
                    "class_names": json.dumps(["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal",
                                               "Shirt", "Sneaker", "Bag", "Ankle boot"], separators=(",", ":"))})

    def shards_model(self, model, size):
        out, val, paths, labels, classes = self.packed_shards()
        ck = self.train(model, "--dataset", "shards", "--data-dir", out, "--image-size", str(size), "--max-steps", "3",
                        "--batch-size", "16", "--lr", "0.02")
        rgb = [cv2.cvtColor(cv2.imread(p), cv2.COLOR_BGR2RGB) for p in paths]
        pixels = np.stack([centre_view(x, 7 / 8, size) for x in rgb]).transpose(0, 3, 1, 2).astype(np.float32)
        self.check(model, ck, ("shards", out, paths, labels, val), pixels,
                   {"model": model, "dataset": "shards", "input_channels": "3", "input_height": str(size),
                    "mean": "0.485,0.456,0.406", "class_names": json.dumps(classes, separators=(",", ":"))})

    def test_variants_without_batch_norm(self):
        """--no-batch-norm models (convolutions with biases, ReLU and max pool layers of their own),
        on the first 500 test images: the same logits and classes (nothing to fold: both exports
        are the same graph)."""
        _, _, _, pixels, labels, _ = self.fashion_mnist()
        folder = os.path.join(self.tmp, "first-500")
        os.makedirs(folder, exist_ok=True)
        paths = [os.path.join(folder, f"{i:03d}.png") for i in range(500)]
        for path, image in zip(paths, pixels[:500, 0].astype(np.uint8)):
            cv2.imwrite(path, image)
        for model in ("cnn", "resnet20"):
            ck = self.train(model + "-nobn", "--no-batch-norm", "--train-samples", "256",
                            "--max-steps", "3", "--test-samples", "16", "--lr", "0.01")
            ours = self.predicted(ck, folder, paths)
            for fold in ([], ["--fold-batch-norm"]):
                path, meta = self.export(ck, f"{model}-nobn{'-folded' if fold else ''}.onnx", *fold)
                # (its metadata said "BatchNormalization with the running statistics", or "folded")
                self.assertEqual(meta["batch_norm"], "none", model)
                self.assertFalse(any(n.op_type == "BatchNormalization" for n in onnx.load(path).graph.node), model)
                theirs = opencv_logits(path, pixels[:500])
                worst = (np.abs(theirs - ours).max(axis=1) / np.abs(ours).max(axis=1)).max()
                self.assertLessEqual(worst, RELATIVE, f"{model} without batch norm")
                self.assertTrue((theirs.argmax(axis=1) == ours.argmax(axis=1)).all(), model)

    def test_mlp(self):
        self.fashion_mnist_model("mlp")

    def test_cnn(self):
        self.fashion_mnist_model("cnn")

    def test_resnet20(self):
        self.shards_model("resnet20", 32)

    def test_resnet18_imagenet_stem(self):
        self.shards_model("resnet18", 72)
        # The exported stem is torchvision's: one max pool, 3x3 at stride 2, padded by 1.
        for name in ("resnet18.onnx", "resnet18-folded.onnx"):
            graph = onnx.load(os.path.join(self.tmp, name)).graph
            pools = [{a.name: list(a.ints) for a in n.attribute if a.ints} for n in graph.node if n.op_type == "MaxPool"]
            self.assertEqual(pools, [{"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}], name)

    def test_resnet50(self):
        self.shards_model("resnet50", 16)


if __name__ == "__main__":
    unittest.main(verbosity=2)

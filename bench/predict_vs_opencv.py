#!/usr/bin/python3
"""hpctrain predict against OpenCV's DNN module on the model hpctrain export wrote, on the CPU, in one
run: for cnn (Fashion-MNIST, 28x28 grey PNGs) and resnet18 (ImageNet-shaped: synthetic data at
--image-size, 256x320 JPEGs), the images/s of each, both reading the same image files, framing them
(centre square, area resize), normalising and classifying them in batches of the same size on the
same number of threads. OpenCV's forward pass alone is timed too.

  bench/predict_vs_opencv.py [--threads T] [--batch B] [--cnn-images N] [--resnet18-images N]
                             [--image-size S]

Environment: BUILD_DIR (default build) or HPCTRAIN, the hpctrain binary; FASHION_MNIST (default
/usr/share/datasets/fashion-mnist). Runs with Debian's python3 (python3-opencv, python3-numpy).
Prints the CPU model, a table, then key=value lines for scripts."""

import argparse
import gzip
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import cv2
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def die(message):
    print(f"predict_vs_opencv: error: {message}", file=sys.stderr)
    sys.exit(2)


def hpctrain_binary():
    if os.environ.get("HPCTRAIN"):
        return os.environ["HPCTRAIN"]
    build = os.environ.get("BUILD_DIR", "build")
    return os.path.join(build if os.path.isabs(build) else os.path.join(ROOT, build), "src", "hpctrain")


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


class Bench:
    def __init__(self, args, tmp):
        self.args, self.tmp, self.hpctrain = args, tmp, hpctrain_binary()
        if not os.access(self.hpctrain, os.X_OK):
            die(f"no hpctrain binary at {self.hpctrain} (run ./setup.sh, or set BUILD_DIR or HPCTRAIN)")

    def run(self, *args):
        p = subprocess.run([self.hpctrain, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if p.returncode != 0:
            die(f"hpctrain {' '.join(args[:2])} failed: {p.stderr.strip()}")
        return p

    def checkpoint_and_model(self, name, *training):
        """A checkpoint (a few steps: the weights do not change the speed) and its ONNX export."""
        ck = os.path.join(self.tmp, f"ck-{name}")
        self.run("--model", name, "--checkpoint-dir", ck, "--max-steps", "2", "--test-samples", "2", "--quiet",
                 "--device", "cpu", "--threads", str(self.args.threads), *training)
        onnx = os.path.join(self.tmp, f"{name}.onnx")
        self.run("export", "--checkpoint", ck, "--output", onnx)
        return ck, onnx

    def predict_rate(self, ck, folder):
        """hpctrain predict's own images/s (from the first image read to the last line printed), and
        its wall time with start-up."""
        t0 = time.perf_counter()
        p = self.run("predict", "--checkpoint", ck, "--device", "cpu", "--threads", str(self.args.threads),
                     "--batch-size", str(self.args.batch), "--top-k", "1", folder)
        wall = time.perf_counter() - t0
        m = re.search(r"classified (\d+) image\(s\) in [0-9.]+ s: ([0-9.]+) images/s", p.stderr)
        if not m:
            die(f"no summary line from hpctrain predict: {p.stderr.strip()}")
        return float(m.group(2)), int(m.group(1)) / wall

    def opencv_rates(self, onnx, paths, side, grey):
        """OpenCV: read, frame (centre square, INTER_AREA, as hpctrain predict), blob, forward, argmax;
        images/s of the whole and of forward alone."""
        cv2.setNumThreads(self.args.threads)
        net = cv2.dnn.readNetFromONNX(onnx)
        net.setInput(np.zeros((1, 1 if grey else 3, side, side), np.float32))
        net.forward()  # warm-up: layer set-up is not per image
        forward = 0.0
        t0 = time.perf_counter()
        for b in range(0, len(paths), self.args.batch):
            images = []
            for path in paths[b:b + self.args.batch]:
                img = cv2.imread(path, cv2.IMREAD_GRAYSCALE if grey else cv2.IMREAD_COLOR)
                h, w = img.shape[:2]
                s = min(h, w)
                img = img[(h - s) // 2:(h - s) // 2 + s, (w - s) // 2:(w - s) // 2 + s]
                if s != side:
                    img = cv2.resize(img, (side, side), interpolation=cv2.INTER_AREA)
                images.append(img)
            blob = cv2.dnn.blobFromImages(images, 1.0, (side, side), swapRB=not grey)
            t1 = time.perf_counter()
            net.setInput(blob)
            net.forward().argmax(axis=1)
            forward += time.perf_counter() - t1
        whole = time.perf_counter() - t0
        return len(paths) / whole, len(paths) / forward

    def cnn(self):
        ck, onnx = self.checkpoint_and_model("cnn", "--train-samples", "256")
        folder = os.path.join(self.tmp, "fashion-mnist")
        os.makedirs(folder)
        path = os.path.join(os.environ.get("FASHION_MNIST", "/usr/share/datasets/fashion-mnist"),
                            "t10k-images-idx3-ubyte.gz")
        with gzip.open(path) as f:
            images = np.frombuffer(f.read()[16:], np.uint8).reshape(-1, 28, 28)[:self.args.cnn_images]
        paths = [os.path.join(folder, f"{i:05d}.png") for i in range(len(images))]
        for p, image in zip(paths, images):
            cv2.imwrite(p, image)
        return self.measure("cnn", ck, onnx, folder, paths, 28, True)

    def resnet18(self):
        size = self.args.image_size
        ck, onnx = self.checkpoint_and_model("resnet18", "--dataset", "synthetic", "--image-size", str(size),
                                             "--batch-size", "2", "--train-samples", "4")
        folder = os.path.join(self.tmp, "photos")
        os.makedirs(folder)
        rng = np.random.default_rng(0)
        h, w = size * 8 // 7, size * 10 // 7  # a little larger than the model's input, as photographs are
        y, x = np.mgrid[0:h, 0:w]
        paths = []
        for i in range(self.args.resnet18_images):
            base = np.dstack([(x * (i + 1)) % 256, (y * 3 + i) % 256, (x + y) % 256]).astype(np.int16)
            img = np.clip(base + rng.integers(-20, 20, size=(h, w, 3)), 0, 255).astype(np.uint8)
            paths.append(os.path.join(folder, f"{i:04d}.jpg"))
            cv2.imwrite(paths[-1], img, [cv2.IMWRITE_JPEG_QUALITY, 90])
        return self.measure("resnet18", ck, onnx, folder, paths, size, False)

    def measure(self, name, ck, onnx, folder, paths, side, grey):
        ours, ours_wall = self.predict_rate(ck, folder)
        theirs, theirs_forward = self.opencv_rates(onnx, paths, side, grey)
        return {"model": name, "images": len(paths), "size": side, "hpctrain": ours, "hpctrain_wall": ours_wall,
                "opencv": theirs, "opencv_forward": theirs_forward}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="threads of each (default: every core)")
    parser.add_argument("--batch", type=int, default=64, help="images per batch, both (default 64)")
    parser.add_argument("--cnn-images", type=int, default=5000, help="Fashion-MNIST test images for cnn")
    parser.add_argument("--resnet18-images", type=int, default=128, help="JPEGs for resnet18")
    parser.add_argument("--image-size", type=int, default=224, help="resnet18's input side (default 224)")
    args = parser.parse_args()
    for name in ("threads", "batch", "cnn_images", "resnet18_images", "image_size"):
        if getattr(args, name) < 1:
            die(f"--{name.replace('_', '-')} must be at least 1")
    tmp = tempfile.mkdtemp(prefix="predict-bench-")
    try:
        bench = Bench(args, tmp)
        rows = [bench.cnn(), bench.resnet18()]
    finally:
        shutil.rmtree(tmp, True)
    print(f"CPU: {cpu_model()} ({os.cpu_count()} logical cores), {args.threads} thread(s), batch {args.batch}")
    print(f"{'model':10} {'images':>6} {'input':>8} {'hpctrain predict':>17} {'OpenCV DNN':>11} "
          f"{'ratio':>6} {'OpenCV forward only':>20}")
    for r in rows:
        print(f"{r['model']:10} {r['images']:>6} {r['size']:>4}x{r['size']:<3} {r['hpctrain']:>11.1f} img/s "
              f"{r['opencv']:>7.1f} img/s {r['hpctrain'] / r['opencv']:>5.2f}x {r['opencv_forward']:>14.1f} img/s")
    print("(hpctrain: its own rate, reading to printing; with start-up, reading the checkpoint: "
          + ", ".join(f"{r['model']} {r['hpctrain_wall']:.1f} img/s" for r in rows) + ")")
    print(f"cpu_model={cpu_model()}")
    for r in rows:
        m = r["model"]
        print(f"{m}_hpctrain_images_per_second={r['hpctrain']:.1f}")
        print(f"{m}_opencv_images_per_second={r['opencv']:.1f}")
        print(f"{m}_opencv_forward_images_per_second={r['opencv_forward']:.1f}")


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""The CPU trainer against PyTorch: the same recipe must be the same mathematics.

torch_parity_probe (its path in TORCH_PARITY_PROBE) runs our layers, models, loss, SGD and
schedules on small inputs and writes them out with what they computed; here PyTorch computes the
same from the same inputs and settings (torch.nn.functional, torch.optim.SGD, torch's LR
schedulers, CrossEntropyLoss(label_smoothing)), and the two must agree to float32 rounding.
Needs Debian's python3-torch (run by /usr/bin/python3); skipped (77, through run_unittest.py)
without it (setup.sh installs it on Debian 12, where CI runs it through must_run.sh); the checks
that matter have torch-free forms in optim_test.cpp and layers_test.cpp as well.
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:  # the whole file needs torch
    print(f"SKIPPED: PyTorch and numpy are not both importable by {sys.executable} ({e}); install python3-torch")
    sys.exit(77)
if tuple(int(v) for v in torch.__version__.split(".")[:2]) < (1, 10):  # label_smoothing came in 1.10
    print(f"SKIPPED: PyTorch {torch.__version__} is older than 1.10, which has CrossEntropyLoss's label smoothing")
    sys.exit(77)

torch.set_default_dtype(torch.float32)
torch.set_num_threads(1)


def probe():
    """The probe's cases, each with its tensors as float32 arrays (read once per process)."""
    if probe.cases is None:
        exe = os.environ.get("TORCH_PARITY_PROBE", "")
        if not exe:
            raise unittest.SkipTest("TORCH_PARITY_PROBE is not set (ctest sets it)")
        with tempfile.TemporaryDirectory() as d:
            subprocess.run([exe, d], check=True)
            data = np.fromfile(os.path.join(d, "data.bin"), dtype=np.float32)
            with open(os.path.join(d, "meta.json"), encoding="utf-8") as f:
                cases = json.load(f)
        for c in cases:
            c["t"] = {name: torch.from_numpy(data[t["offset"]:t["offset"] + int(np.prod(t["shape"]))].copy()
                                             .reshape(t["shape"]))
                      for name, t in c.get("tensors", {}).items()}
        probe.cases = cases
    return probe.cases


probe.cases = None


def cases(kind):
    return [c for c in probe() if c["case"] == kind]


class Close:
    """assert ours == torch's to rtol relative to the largest magnitude of torch's values (or to
    floor, where those are rounding noise around an exact zero)."""

    def assertClose(self, ours, theirs, rtol, what, floor=1e-30):
        ours, theirs = ours.detach().double(), theirs.detach().double()
        self.assertEqual(tuple(ours.shape), tuple(theirs.shape), what)
        scale = max(theirs.abs().max().item(), floor)
        err = (ours - theirs).abs().max().item() / scale
        self.assertLessEqual(err, rtol, f"{what}: max |ours - torch| / max |torch| = {err:.3g} > {rtol:g}")


# ---- the zoo's networks, built in PyTorch from the probe's description -----------------------------
# Our activations are NHWC and a convolution's weight is (out, kh, kw, in); PyTorch's are NCHW and
# (out, in, kh, kw). The parameters stay in our layout (so their gradients are in it too) and are
# permuted where PyTorch uses them; a flatten takes the NHWC order, as ours does.

def forward(node, x, p, buf, train):
    kind = node["kind"]
    if kind == "sequential":
        for layer in node["layers"]:
            x = forward(layer, x, p, buf, train)
        return x
    if kind == "residual":
        main = forward(node["main"], x, p, buf, train)
        short = forward(node["shortcut"], x, p, buf, train)
        return F.relu(main + short)
    if kind == "conv":
        bias = p[node["bias"]] if node["bias"] else None
        return F.conv2d(x, p[node["weight"]].permute(0, 3, 1, 2), bias, node["stride"], node["padding"])
    if kind == "batchnorm":
        x = F.batch_norm(x, buf[node["running_mean"]], buf[node["running_var"]], p[node["weight"]], p[node["bias"]],
                         training=train, momentum=node["momentum"], eps=node["eps"])
        if node["relu"]:
            x = F.relu(x)
        if node["pool"]:
            x = F.max_pool2d(x, node["pool"], node["pool_stride"])
        return x
    if kind == "relu":
        return F.relu(x)
    if kind == "maxpool":
        return F.max_pool2d(x, node["kernel"], node["stride"], node["padding"])
    if kind == "global_avg_pool":
        return x.mean(dim=(2, 3))
    if kind == "flatten":
        return x.permute(0, 2, 3, 1).reshape(x.shape[0], -1)
    if kind == "linear":
        bias = p[node["bias"]] if node["bias"] else None
        return F.linear(x, p[node["weight"]], bias)
    raise AssertionError(f"no PyTorch form for layer kind {kind}")


def nchw(x):
    return x.permute(0, 3, 1, 2).contiguous()


class Models(unittest.TestCase, Close):
    """Each model of the zoo: one step's logits, loss, every gradient, the running statistics and
    an evaluation with them; then three steps of the recipe (SGD with Nesterov momentum and weight
    decay on every tensor, one-cycle lr and momentum, label smoothing 0.1)."""

    def state(self, c, prefix):
        params = {k[len(prefix):]: v.clone().requires_grad_(True) for k, v in c["t"].items()
                  if k.startswith(prefix) and ".buffer." not in k and not k.startswith(prefix + "buffer.")}
        bufs = {int(k.split(".")[-1]): v.clone() for k, v in c["t"].items() if k.startswith(prefix + "buffer.")}
        return params, bufs

    def test_one_step_forward_and_backward(self):
        for c in cases("model"):
            with self.subTest(model=c["name"]):
                t = c["t"]
                p, buf = self.state(c, "initial.")
                labels = torch.tensor(c["labels"][0], dtype=torch.long)
                logits = forward(c["net"], nchw(t["x0"]), p, buf, True)
                loss = F.cross_entropy(logits, labels, label_smoothing=c["label_smoothing"])
                loss.backward()
                self.assertClose(t["logits"], logits, 2e-5, "logits")
                self.assertClose(t["loss"], loss.reshape(1), 2e-6, "loss")
                # A convolution's bias before batch norm has no gradient (the mean takes it out): both
                # hold rounding noise there, measured against the model's largest gradient.
                floor = max(v.grad.abs().max().item() for v in p.values())
                for name, v in p.items():
                    self.assertClose(t["grad." + name], v.grad, 1e-4, f"gradient of {name}", floor)
                for i, b in buf.items():
                    self.assertClose(t[f"after_step1.buffer.{i}"], b, 2e-5, f"buffer {i} after a training step")
                with torch.no_grad():
                    ev = forward(c["net"], nchw(t["x0"]), p, buf, False)
                self.assertClose(t["eval_logits"], ev, 2e-5, "evaluation logits")

    def test_imagenet_stem_is_torchvisions(self):
        """Above 64 pixels a side resnet18/50 start as torchvision's resnet: conv 7x7/2 padded by 3,
        batch norm + ReLU, max pool 3x3/2 padded by 1 (so the models above compare like for like)."""
        c = next(c for c in cases("model") if c["name"] == "resnet18_imagenet_stem")
        conv, norm, pool = c["net"]["layers"][:3]
        self.assertEqual((conv["kind"], conv["kernel"], conv["stride"], conv["padding"]), ("conv", 7, 2, 3))
        self.assertEqual((norm["kind"], norm["relu"], norm["pool"]), ("batchnorm", True, 0))
        self.assertEqual((pool["kind"], pool["kernel"], pool["stride"], pool["padding"]), ("maxpool", 3, 2, 1))

    # Three steps of resnet18 at 72 pixels on a few images are chaotic at this learning rate: the
    # stem's weights after them, PyTorch in float32 against PyTorch in float64, differ by 5.4e-3 of
    # their largest (the old 2x2/2 stem pool, 2 images) and 1.4e-2 (torchvision's, 4 images);
    # ours by 2.3e-3 (torchvision's, 2 images, where PyTorch's float32 happened to stay within
    # 3e-6). Rounding alone moves the result past any bound a test could hold (measured
    # 2026-12-04). Its one step above (logits, every gradient, running statistics) compares it.
    CHAOTIC_OVER_STEPS = ("resnet18_imagenet_stem",)

    def test_three_steps_of_the_recipe(self):
        for c in cases("model"):
            if c["name"] in self.CHAOTIC_OVER_STEPS:
                continue
            with self.subTest(model=c["name"]):
                t, s, oc = c["t"], c["sgd"], c["onecycle"]
                p, buf = self.state(c, "initial.")
                opt = torch.optim.SGD(list(p.values()), lr=oc["max_lr"], momentum=s["momentum"],
                                      nesterov=s["nesterov"], weight_decay=s["weight_decay"])
                sched = torch.optim.lr_scheduler.OneCycleLR(
                    opt, max_lr=oc["max_lr"], total_steps=c["steps"], pct_start=oc["pct_start"],
                    div_factor=oc["div_factor"], final_div_factor=oc["final_div_factor"],
                    base_momentum=oc["base_momentum"], max_momentum=oc["max_momentum"])
                for k in range(c["steps"]):
                    opt.zero_grad()
                    logits = forward(c["net"], nchw(t[f"x{k}"]), p, buf, True)
                    F.cross_entropy(logits, torch.tensor(c["labels"][k], dtype=torch.long),
                                    label_smoothing=c["label_smoothing"]).backward()
                    opt.step()
                    sched.step()
                for name, v in p.items():
                    self.assertClose(t["final." + name], v, 1e-4, f"{name} after {c['steps']} steps")
                for i, b in buf.items():
                    self.assertClose(t[f"final.buffer.{i}"], b, 1e-4, f"buffer {i} after {c['steps']} steps")


class Loss(unittest.TestCase, Close):
    def test_cross_entropy_with_label_smoothing(self):
        for c in cases("loss"):
            with self.subTest(label_smoothing=c["label_smoothing"]):
                z = c["t"]["logits"].clone().requires_grad_(True)
                loss = F.cross_entropy(z, torch.tensor(c["labels"], dtype=torch.long),
                                       label_smoothing=c["label_smoothing"])
                loss.backward()
                self.assertClose(c["t"]["loss"], loss.reshape(1), 1e-6, "loss")
                self.assertClose(c["t"]["dlogits"], z.grad, 1e-6, "gradient of the logits")


class Sgd(unittest.TestCase, Close):
    """torch.optim.SGD over parameter groups: the decayed tensors and, without
    --decay-bias-and-norm, the biases and batch-norm parameters without decay."""

    def test_updates_as_torch_optim_sgd(self):
        for c in cases("sgd"):
            with self.subTest(nesterov=c["nesterov"], decay_all=c["decay_bias_and_norm"], mu=c["momentum"][0]):
                t = c["t"]
                p = {k[len("initial."):]: v.clone().requires_grad_(True) for k, v in t.items()
                     if k.startswith("initial.")}
                decayed = [v for k, v in p.items() if c["decay_bias_and_norm"] or c["roles"][k] == "weight"]
                others = [v for k, v in p.items() if not any(v is d for d in decayed)]
                groups = [{"params": decayed, "weight_decay": c["weight_decay"]}]
                if others:
                    groups.append({"params": others, "weight_decay": 0.0})
                opt = torch.optim.SGD(groups, lr=0.1, momentum=c["momentum"][0], nesterov=c["nesterov"])
                for k, lr in enumerate(c["lr"]):
                    for name, v in p.items():
                        v.grad = t[f"grad{k}.{name}"].clone()
                    for g in opt.param_groups:
                        g["lr"], g["momentum"] = lr, c["momentum"][k]
                    opt.step()
                for name, v in p.items():
                    self.assertClose(t["final." + name], v, 1e-6, f"{name} ({c['roles'][name]}) after 4 steps")


class Schedules(unittest.TestCase, Close):
    """Our lr (and momentum) before each step, where each epoch is 5 steps, against PyTorch's
    schedulers stepped once per step."""

    def reference(self, c):
        s, steps, lr0 = c["settings"], c["steps"], c["lr0"]
        opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr0, momentum=0.9)
        warmup = s.get("warmup_steps", 0)
        name = c["name"]
        if name == "constant":
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0)
        elif name == "step":
            sched = torch.optim.lr_scheduler.MultiStepLR(opt, s["milestones"], s["gamma"])
        elif name.startswith("cosine"):
            sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps, eta_min=s["eta_min"])
        else:
            sched = torch.optim.lr_scheduler.OneCycleLR(
                opt, max_lr=lr0, total_steps=steps, **{k: v for k, v in s.items()})
        lrs, mus = [], []
        for k in range(steps):
            # The documented warm-up: the schedule's lr times k / warm-up steps, rising from 0.
            lrs.append(opt.param_groups[0]["lr"] * (min(k / warmup, 1.0) if warmup else 1.0))
            mus.append(opt.param_groups[0]["momentum"])
            opt.step()
            sched.step()
        return torch.tensor(lrs, dtype=torch.float64), torch.tensor(mus, dtype=torch.float64)

    def test_every_step_as_pytorch(self):
        for c in cases("schedule"):
            with self.subTest(schedule=c["name"]):
                lrs, mus = self.reference(c)
                self.assertClose(torch.tensor(c["lr"], dtype=torch.float64), lrs, 1e-12, "lr")
                self.assertClose(torch.tensor(c["momentum"], dtype=torch.float64), mus, 1e-12, "momentum")


if __name__ == "__main__":
    unittest.main()

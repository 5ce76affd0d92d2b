#!/usr/bin/python3
"""The peer's recipe, step by step, from given weights: loads an ONNX file that `hpctrain export`
wrote for the cnn model, trains the peer's own model (torch_peer.Net) on the first N training
samples as one full batch per step, with the peer's optimizer and schedule (SGD with Nesterov
momentum 0.9, weight decay 5e-4, OneCycleLR peaking at --lr over --steps steps, cross entropy
with --label-smoothing), and prints one JSON line per step: step, loss (before the step's
update), lr and momentum; then a last line with the test loss and accuracy of the first
--test-samples test samples in eval mode (batch norm's running statistics).
bench/recipe_vs_peer.sh compares these with hpctrain's metrics.
Usage: torch_recipe_steps.py PEER_SCRIPT ONNX_FILE --steps S --samples N --lr LR --label-smoothing E
       --test-samples M"""
import argparse, importlib.util, json
import numpy as np, onnx, torch, torch.nn.functional as F
from onnx import numpy_helper

p = argparse.ArgumentParser()
p.add_argument("peer"); p.add_argument("onnx")
p.add_argument("--steps", type=int, required=True); p.add_argument("--samples", type=int, required=True)
p.add_argument("--lr", type=float, required=True); p.add_argument("--label-smoothing", type=float, required=True)
p.add_argument("--test-samples", type=int, required=True)
a = p.parse_args()
spec = importlib.util.spec_from_file_location("torch_peer", a.peer)
tp = importlib.util.module_from_spec(spec); spec.loader.exec_module(tp)
torch.set_num_threads(1)
weights = {i.name: torch.from_numpy(numpy_helper.to_array(i).copy()) for i in onnx.load(a.onnx).graph.initializer}
net = tp.Net()
# hpctrain's ONNX names its parameters by layer index (the layers in the model's order, the
# ReLUs, pools and flatten included); the export gives fc1 the NCHW flatten order PyTorch uses.
with torch.no_grad():
    for module, k in ((net.c1, 0), (net.b1, 1), (net.c2, 2), (net.b2, 3), (net.f1, 5), (net.f2, 7)):
        module.weight.copy_(weights[f"param.{k}.weight"]); module.bias.copy_(weights[f"param.{k}.bias"])
d = tp.default_data_dir()

def first(split, n):
    """The first n images of a split ("train" or "t10k"), normalised as the peer does, and labels."""
    x = torch.from_numpy(tp.idx(f"{d}/{split}-images-idx3-ubyte.gz")[:n].astype(np.float32) / 255.0)
    y = torch.from_numpy(tp.idx(f"{d}/{split}-labels-idx1-ubyte.gz")[:n].astype(np.int64))
    return (x - 0.2860) / 0.3530, y

x, y = first("train", a.samples)
opt = torch.optim.SGD(net.parameters(), lr=a.lr, momentum=0.9, weight_decay=5e-4, nesterov=True)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=a.lr, total_steps=a.steps)
net.train()
for s in range(a.steps):
    group = opt.param_groups[0]
    lr, momentum = group["lr"], group["momentum"]
    loss = F.cross_entropy(net(x), y, label_smoothing=a.label_smoothing)
    opt.zero_grad(set_to_none=True); loss.backward(); opt.step(); sched.step()
    print(json.dumps(dict(step=s + 1, loss=loss.item(), lr=lr, momentum=momentum)))
# In eval mode, as hpctrain's evaluation: the batch norms' running statistics decide it.
xt, yt = first("t10k", a.test_samples)
net.eval()
with torch.no_grad():
    logits = net(xt)
    test_loss = F.cross_entropy(logits, yt, label_smoothing=a.label_smoothing).item()
    test_accuracy = (logits.argmax(1) == yt).float().mean().item()
print(json.dumps(dict(test_loss=test_loss, test_accuracy=test_accuracy)))

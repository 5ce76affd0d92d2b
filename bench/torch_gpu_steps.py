#!/usr/bin/env python3
"""PyTorch's training step on one GPU with the batch already there, timed as bench/gpu_step
times hpctrain's: --warmup steps, then --iters steps between two CUDA events, random data
made on the GPU, no loss read back.

  cnn       the peer's small CNN (torch_peer_gpu.py's Net: hpctrain's cnn), 28x28x1, 10 classes
  resnet50  torchvision's ResNet-50, 224x224x3, 1000 classes

Options: --batch, --precision fp32|tf32|bf16 (autocast), --channels-last, --compile,
--warmup, --iters. Prints one JSON line."""
import argparse
import json

import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):  # the same as torch_peer_gpu.py's, and hpctrain's cnn
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 32, 3, padding=1); self.b1 = nn.BatchNorm2d(32)
        self.c2 = nn.Conv2d(32, 64, 3, padding=1); self.b2 = nn.BatchNorm2d(64)
        self.f1 = nn.Linear(64 * 7 * 7, 128); self.f2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.b1(self.c1(x))), 2)
        x = F.max_pool2d(F.relu(self.b2(self.c2(x))), 2)
        return self.f2(F.relu(self.f1(x.flatten(1))))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("workload", choices=["cnn", "resnet50"])
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--precision", choices=["fp32", "tf32", "bf16"], default="tf32")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--warmup", type=int, default=15)
    p.add_argument("--iters", type=int, default=50)
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = a.precision != "fp32"
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(1)
    if a.workload == "cnn":
        model, shape, classes = Net(), (a.batch, 1, 28, 28), 10
    else:
        import torchvision
        model, shape, classes = torchvision.models.resnet50(), (a.batch, 3, 224, 224), 1000
    mf = torch.channels_last if a.channels_last else torch.contiguous_format
    model = model.cuda().to(memory_format=mf)
    step_model = torch.compile(model) if a.compile else model
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4, nesterov=True)
    x = torch.randn(*shape, device="cuda").to(memory_format=mf)
    y = torch.randint(0, classes, (a.batch,), device="cuda")
    dtype = torch.bfloat16 if a.precision == "bf16" else None

    def step():
        with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
            loss = F.cross_entropy(step_model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(a.warmup):
        step()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(a.iters):
        step()
    stop.record()
    stop.synchronize()
    step_ms = start.elapsed_time(stop) / a.iters
    print(json.dumps(dict(workload=a.workload, peer="pytorch-" + torch.__version__, precision=a.precision,
                          batch=a.batch, warmup=a.warmup, iters=a.iters, channels_last=a.channels_last,
                          compile=a.compile, step_ms=round(step_ms, 4),
                          images_per_s=round(1000 * a.batch / step_ms, 1))), flush=True)


if __name__ == "__main__":
    main()

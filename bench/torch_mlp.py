#!/usr/bin/env python3
"""PyTorch eager reference for shardscope's MLP: Linear(w, w) + ReLU per layer, MSE
against ones, AdamW (torch defaults), fp32 with TF32 off. Prints the median and min
step time in ms over the steps after the first (warm-up), as `median min`."""
import argparse
import statistics
import time

import torch

ap = argparse.ArgumentParser()
ap.add_argument("--device", default="cpu")
ap.add_argument("--layers", type=int, default=8)
ap.add_argument("--width", type=int, default=256)
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--steps", type=int, default=21)
ap.add_argument("--threads", type=int, default=1)
a = ap.parse_args()
torch.set_num_threads(a.threads)
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = torch.device(a.device)
mods = []
for _ in range(a.layers):
    mods += [torch.nn.Linear(a.width, a.width), torch.nn.ReLU()]
model = torch.nn.Sequential(*mods).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.rand(a.batch, a.width, device=dev) * 2 - 1
target = torch.ones(a.batch, a.width, device=dev)
times = []
for _ in range(a.steps):
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=False)
    loss = torch.nn.functional.mse_loss(model(x), target)
    loss.backward()
    opt.step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    times.append((time.perf_counter() - t0) * 1e3)
t = times[1:]
print(f"{statistics.median(t):.3f} {min(t):.3f}")

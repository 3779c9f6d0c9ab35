#!/usr/bin/env python3
"""What torch saves for backward in the seed's MLP under torch.autocast(bfloat16).

The MLP of docs/design.md §2 (L x Linear(w, w) with bias, each followed by ReLU with
--activation relu; loss sum = y.sum() or mse against a target of ones, fp32 parameters),
its forward and loss run under torch.autocast("cpu", dtype=torch.bfloat16), as torch's
mixed precision does. Every tensor autograd saves passes through
torch.autograd.graph.saved_tensors_hooks; the figure is the unique untyped storages among
them, parameters excluded, and their bytes (what shardscope's saved.after_forward_bytes
and after_forward_tensors count), each itemized with its dtype, shape, the node that
saved it and "param_cast" for a weight's bf16 cast. It also prints the dtypes autocast
gives the Linear's and ReLU's outputs and the loss.

Usage: bench/torch_autocast_mlp.py [--shapes L,w,B;...] [--itemize]
With --shardscope BINARY, runs `BINARY run --precision bf16` on each shape (one rank, one
step) and prints its figures beside torch's. torch is a dependency of this bench only.
Exit status 0; 1 when a shardscope figure differs; 2 when torch cannot be imported.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def measure(torch, layers, width, batch, activation, loss, itemize):
    nn = torch.nn
    F = torch.nn.functional
    torch.manual_seed(0)
    mods = []
    for _ in range(layers):
        mods.append(nn.Linear(width, width))
        if activation == "relu":
            mods.append(nn.ReLU())
    model = nn.Sequential(*mods)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = []

    def pack(t):
        saved.append(t)
        return t

    x = torch.rand(batch, width) * 2 - 1
    target = torch.ones(batch, width)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = model(x)
            value = y.sum() if loss == "sum" else F.mse_loss(y, target)
    weight_casts = set()
    for name, p in model.named_parameters():
        if name.endswith("weight"):
            weight_casts.add(tuple(p.detach().to(torch.bfloat16).flatten().tolist()))
    seen = {}
    lines = []
    for t in saved:
        ptr = t.untyped_storage().data_ptr()
        if ptr in params or ptr in seen:
            continue
        nbytes = t.untyped_storage().nbytes()
        is_cast = t.dtype == torch.bfloat16 and t.dim() == 2 and t.shape[0] == t.shape[1] == width and (
            tuple(t.t().flatten().tolist()) in weight_casts or tuple(t.flatten().tolist()) in weight_casts)
        seen[ptr] = nbytes
        node = type(t.grad_fn).__name__ if t.grad_fn is not None else "-"
        lines.append(f"    {nbytes:8d} B  {str(t.dtype):15s} {tuple(t.shape)}  {node}{'  param_cast' if is_cast else ''}")
    total = sum(seen.values())
    head = (f"L={layers} w={width} B={batch} {activation} {loss}: torch {total:,} B in {len(seen)} storages"
            f" (outputs {y.dtype}, loss {value.dtype})")
    return total, len(seen), head, lines if itemize else []


def shardscope_saved(binary, layers, width, batch, activation, loss):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "r.json")
        subprocess.run([binary, "run", "--backend", "cpu", "--precision", "bf16", "--layers", str(layers), "--width",
                        str(width), "--batch", str(batch), "--activation", activation, "--loss", loss, "--steps", "1",
                        "--json", path], check=True, stdout=subprocess.DEVNULL)
        with open(path) as f:
            rank = json.load(f)["runs"][0]["ranks"][0]
    return rank["saved"]["after_forward_bytes"], rank["saved"]["after_forward_tensors"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="3,8,4;4,37,6;8,256,32")
    ap.add_argument("--itemize", action="store_true")
    ap.add_argument("--shardscope", metavar="BINARY")
    args = ap.parse_args()
    try:
        import torch
    except ImportError as e:
        print(f"torch_autocast_mlp: cannot import torch: {e}", file=sys.stderr)
        return 2
    print(f"torch {torch.__version__}, CPU autocast(bfloat16)")
    status = 0
    for shape in args.shapes.split(";"):
        layers, width, batch = (int(v) for v in shape.split(","))
        for activation in ("none", "relu"):
            for loss in ("sum", "mse"):
                total, count, head, lines = measure(torch, layers, width, batch, activation, loss, args.itemize)
                if args.shardscope:
                    b, n = shardscope_saved(args.shardscope, layers, width, batch, activation, loss)
                    same = (b, n) == (total, count)
                    head += f"  shardscope {b:,} B in {n} storages, {'equal' if same else 'DIFFERENT'}"
                    status = status if same else 1
                print(head)
                for line in lines:
                    print(line)
    return status


if __name__ == "__main__":
    sys.exit(main())

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

With --checkpoint full|every:K each (every K-th: 0, K, 2K, ...) layer (its Linear and its
ReLU) runs inside torch.utils.checkpoint(use_reentrant=False), as shardscope's
--checkpoint wraps a layer: the outer hooks then see the checkpoint's save of the layer's
input (the fp32 batch for layer 0) and none of the saves inside it.

--casts prints which bf16 casts are alive at the end of forward, after the autocast region
and at each GEMM of backward (a wrapped layer's re-run among them).

Usage: bench/torch_autocast_mlp.py [--shapes L,w,B;...] [--checkpoint none|full|every:K] [--itemize] [--casts]
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


def wrapped_layers(layers, checkpoint):
    """The layers --checkpoint wraps: none, full (every one) or every:K (0, K, 2K, ...)."""
    if checkpoint == "none":
        return set()
    every = 1 if checkpoint == "full" else int(checkpoint.split(":", 1)[1])
    return {i for i in range(layers) if i % every == 0}


def measure(torch, layers, width, batch, activation, loss, itemize, checkpoint="none"):
    nn = torch.nn
    F = torch.nn.functional
    torch.manual_seed(0)
    blocks = []
    for _ in range(layers):
        mods = [nn.Linear(width, width)]
        if activation == "relu":
            mods.append(nn.ReLU())
        blocks.append(nn.Sequential(*mods))
    model = nn.Sequential(*blocks)
    wrapped = wrapped_layers(layers, checkpoint)

    def forward(x):
        for i, block in enumerate(blocks):
            x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False) if i in wrapped else block(x)
        return x

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = []

    def pack(t):
        saved.append(t)
        return t

    x = torch.rand(batch, width) * 2 - 1
    target = torch.ones(batch, width)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = forward(x)
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
    head = (f"L={layers} w={width} B={batch} {activation} {loss} checkpoint={checkpoint}: torch {total:,} B in {len(seen)} storages"
            f" (outputs {y.dtype}, loss {value.dtype})")
    return total, len(seen), head, lines if itemize else []


def cast_lifetimes(torch, layers, width, batch, activation, checkpoint):
    """Which bf16 casts autocast made are alive (their storages, watched by weak
    references) at the end of forward inside the region, after it, and at every op of
    backward: the cast cache's and autograd's holds, the re-run's own region included."""
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    nn = torch.nn
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(width, width), *([nn.ReLU()] if activation == "relu" else []))
              for _ in range(layers)]
    wrapped = wrapped_layers(layers, checkpoint)
    casts, phase, lines = [], ["forward"], []

    def alive():
        return " ".join(f"{name}{shape}" for name, shape, ref in casts if not ref.expired()) or "-"

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.__name__
            if name.startswith("_to_copy") and isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16:
                casts.append((f"{phase[0][0]}{len(casts)}", tuple(out.shape), StorageWeakRef(out.untyped_storage())))
            if phase[0] == "backward" and name.split(".")[0] in ("addmm", "mm", "relu", "threshold_backward"):
                lines.append(f"    {name:28s} alive: {alive()}")
            return out

    x = torch.rand(batch, width)
    with Watch():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = x
            for i, block in enumerate(blocks):
                h = torch.utils.checkpoint.checkpoint(block, h, use_reentrant=False) if i in wrapped else block(h)
            value = h.float().sum()
            lines.insert(0, f"    end of forward (in the region)  alive: {alive()}")
        lines.insert(1, f"    after the region                alive: {alive()}")
        phase[0] = "backward"
        value.backward()
    return lines


def shardscope_saved(binary, layers, width, batch, activation, loss, checkpoint="none"):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "r.json")
        subprocess.run([binary, "run", "--backend", "cpu", "--precision", "bf16", "--layers", str(layers), "--width",
                        str(width), "--batch", str(batch), "--activation", activation, "--loss", loss, "--steps", "1",
                        "--checkpoint", checkpoint, "--json", path], check=True, stdout=subprocess.DEVNULL)
        with open(path) as f:
            rank = json.load(f)["runs"][0]["ranks"][0]
    return rank["saved"]["after_forward_bytes"], rank["saved"]["after_forward_tensors"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="3,8,4;4,37,6;8,256,32")
    ap.add_argument("--itemize", action="store_true")
    ap.add_argument("--checkpoint", default="none", help="none, full or every:K (torch's non-reentrant checkpoint)")
    ap.add_argument("--casts", action="store_true",
                    help="print which weight, bias and input casts are alive through the step (f: made in forward, "
                         "b: in backward)")
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
                total, count, head, lines = measure(torch, layers, width, batch, activation, loss, args.itemize,
                                                    args.checkpoint)
                if args.shardscope:
                    b, n = shardscope_saved(args.shardscope, layers, width, batch, activation, loss, args.checkpoint)
                    same = (b, n) == (total, count)
                    head += f"  shardscope {b:,} B in {n} storages, {'equal' if same else 'DIFFERENT'}"
                    status = status if same else 1
                print(head)
                for line in lines:
                    print(line)
                if args.casts:
                    for line in cast_lifetimes(torch, layers, width, batch, activation, args.checkpoint):
                        print(line)
    return status


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""PyTorch eager's step time on the model `shardscope run` trains, on one thread.

The model: --layers x Linear(width, width) with bias, ReLU after every layer, MSE against
a (batch, width) target of ones, torch.optim.AdamW with torch's defaults (lr 1e-3,
betas (0.9, 0.999), eps 1e-8, weight_decay 1e-2). Batches are (batch, width) uniform in
[-1, 1), drawn before the loop. One step is zero_grad, forward, loss, backward and
optimizer step, timed with time.perf_counter around each; the first --warmup steps are
not counted. Prints one JSON line: {"median_ms", "min_ms", "max_ms", "steps", ...}.

Exit status 2, with a message on stderr, when torch cannot be imported.
"""
import argparse
import json
import statistics
import sys
import time
import warnings


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=100, help="timed steps (default 100)")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps first (default 10)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    warnings.filterwarnings("ignore")  # e.g. "Failed to initialize NumPy" when numpy is absent
    try:
        import torch
    except ImportError as e:
        print(f"torch_compare.py: PyTorch is not installed ({e}); "
              "install it with: pip install torch --index-url https://download.pytorch.org/whl/cpu "
              "(or pip install torch)", file=sys.stderr)
        return 2

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.AdamW(model.parameters())
    loss_fn = torch.nn.MSELoss()
    target = torch.ones(args.batch, args.width)
    total = args.warmup + args.steps
    batches = [torch.rand(args.batch, args.width) * 2 - 1 for _ in range(total)]

    ms = []
    for s in range(total):
        x = batches[s]
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(model(x), target)
        loss.backward()
        opt.step()
        t1 = time.perf_counter()
        if s >= args.warmup:
            ms.append((t1 - t0) * 1e3)

    print(json.dumps({
        "median_ms": statistics.median(ms),
        "min_ms": min(ms),
        "max_ms": max(ms),
        "steps": len(ms),
        "warmup": args.warmup,
        "layers": args.layers,
        "width": args.width,
        "batch": args.batch,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "blas": "mkl" if torch.backends.mkl.is_available() else "other",
        "loss": float(loss.item()),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())

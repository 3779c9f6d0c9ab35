#!/usr/bin/env python3
"""What one pipeline stage holds of autocast's weight casts, measured with torch.

A stage of a pipeline runs M micro-batches' forwards before their backwards (GPipe's order;
1F1B's warm-up alike). Under torch.autocast(bfloat16) every Linear casts its weight to bf16
through autocast's cast cache, and the GEMM saves that cast for backward when its input
needs a gradient (a stage past the first: its input is received). Two ways to place the
autocast region around a stage's work:

  per micro-batch  torch.autocast around each micro-batch's forward (accelerate wraps a
                   module's forward this way; the loss inside it on the last stage): the
                   cache is cleared when each region exits, so every micro-batch makes and
                   saves its own casts: M casts a weight held until the backwards.
  one region       torch.autocast around the whole schedule step: the first micro-batch's
                   casts stay cached and every later forward reuses them: one cast a weight.

shardscope models the first (docs/formulas.md, "bf16: the pipeline"). This script counts
the distinct bf16 weight-shaped storages autograd holds after the M forwards in each
placement, and the dtype of what the stage would send on: the output of a Linear stack
(the MLP: bf16) and of a residual block (fp32 + bf16 is fp32: a transformer's).

Usage: bench/torch_pipeline_autocast.py [--layers 3] [--width 64] [--microbatches 4]
torch is a dependency of this bench only. Exit 0; 1 when a count differs from the model
above; 2 when torch cannot be imported.
"""
import argparse
import sys


def held_casts(torch, layers, width, microbatches, per_microbatch):
    nn = torch.nn
    torch.manual_seed(0)
    stage = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
    shapes = {tuple(p.shape) for p in stage.parameters() if p.dim() == 2}
    casts = {}

    def pack(t):
        if t.dtype == torch.bfloat16 and tuple(t.shape) in shapes:
            casts[t.untyped_storage().data_ptr()] = t  # keeps it alive as autograd does
        return t

    outs = []
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        if per_microbatch:
            for _ in range(microbatches):
                x = torch.randn(2, width, requires_grad=True)  # a received activation
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    outs.append(stage(x))
        else:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                for _ in range(microbatches):
                    x = torch.randn(2, width, requires_grad=True)
                    outs.append(stage(x))
    out_dtype = outs[0].dtype
    # A residual block: fp32 input + the Linear's bf16 output.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        x = torch.randn(2, width, requires_grad=True)
        residual_dtype = (x + stage[0](x)).dtype
    return len(casts), out_dtype, residual_dtype


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--microbatches", type=int, default=4)
    a = ap.parse_args()
    try:
        import torch
    except ImportError as e:
        print(f"torch_pipeline_autocast: torch is needed: {e}", file=sys.stderr)
        return 2
    print(f"torch {torch.__version__}: a stage of {a.layers} Linear({a.width}, {a.width}), "
          f"{a.microbatches} micro-batches' forwards before their backwards")
    bad = 0
    for per_mb, expect in ((True, a.layers * a.microbatches), (False, a.layers)):
        n, out_dtype, residual_dtype = held_casts(torch, a.layers, a.width, a.microbatches, per_mb)
        name = "per micro-batch" if per_mb else "one region"
        print(f"  {name:16s} weight casts held: {n} (expected {expect}); a Linear stack sends "
              f"{out_dtype}, a residual block {residual_dtype}")
        bad |= n != expect
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

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

Then the lifetime of every parameter cast (weights' and biases', saved by autograd or
not), seen through a TorchDispatchMode (each bf16 _to_copy of a parameter) and weak
references to the casts' storages: the live casts after each action of a stage's
schedule (GPipe's: every F, then every B; 1F1B's: a warm-up of two F, then F and B in
turn), for a stage whose input is received (every Linear's input needs a gradient) and
for the first stage (its first Linear's input, the batch, needs none). The model:

  per micro-batch  after an action, L casts of weights (L - 1 on the first stage) for
                   each micro-batch whose F has run and whose B has not; bias casts and
                   unsaved weight casts die as each F's region exits.
  one region       2L casts (every weight and bias, once) from the first F on, through
                   every B (autograd's saved references end with each B, the cache's do
                   not), and none once the region exits after the last B.

Usage: bench/torch_pipeline_autocast.py [--layers 3] [--width 64] [--microbatches 4]
torch is a dependency of this bench only. Exit 0; 1 when a count differs from the model
above; 2 when torch cannot be imported.
"""
import argparse
import contextlib
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


def schedule(order, microbatches):
    """The stage's actions, ("F" | "B", micro-batch): GPipe's, or 1F1B's with a warm-up of 2."""
    if order == "gpipe":
        return [("F", i) for i in range(microbatches)] + [("B", i) for i in range(microbatches)]
    warm = min(2, microbatches - 1)
    acts = [("F", i) for i in range(warm)]
    for i in range(warm, microbatches):
        acts += [("F", i), ("B", i - warm)]
    return acts + [("B", i) for i in range(microbatches - warm, microbatches)]


def cast_lifetimes(torch, layers, width, microbatches, per_microbatch, order, received):
    """Live parameter casts (weights, biases) after each action, and after the region exits."""
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode

    nn = torch.nn
    torch.manual_seed(0)
    stage = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
    params = {p.data_ptr(): p.dim() for p in stage.parameters()}
    casts = []  # (is a weight's, weak reference to the cast's storage)

    class Casts(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if (func is torch.ops.aten._to_copy.default and out.dtype == torch.bfloat16
                    and args[0].data_ptr() in params):
                casts.append((params[args[0].data_ptr()] == 2, StorageWeakRef(out.untyped_storage())))
            return out

    def live():
        alive = {}
        for weight, ref in casts:
            if not ref.expired():
                alive[ref.cdata] = weight
        return sum(alive.values()), sum(not w for w in alive.values())

    trace = []
    outs = {}
    region = contextlib.nullcontext() if per_microbatch else torch.autocast("cpu", dtype=torch.bfloat16)
    with Casts(), region:
        for kind, i in schedule(order, microbatches):
            if kind == "F":
                x = torch.randn(2, width, requires_grad=received)
                with torch.autocast("cpu", dtype=torch.bfloat16) if per_microbatch else contextlib.nullcontext():
                    outs[i] = stage(x).float().sum()
            else:
                outs.pop(i).backward()
            trace.append((f"{kind}{i}", live()))
    return trace, live()


def expected_lifetimes(layers, microbatches, per_microbatch, order, received):
    """The model in the docstring: live (weights, biases) after each action, and at the end."""
    trace, in_flight = [], 0
    for n, (kind, i) in enumerate(schedule(order, microbatches)):
        in_flight += 1 if kind == "F" else -1
        if per_microbatch:
            trace.append((f"{kind}{i}", (in_flight * (layers - (0 if received else 1)), 0)))
        else:
            trace.append((f"{kind}{i}", (layers, layers)))
    return trace, (0, 0)


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
    print("  live parameter casts (weights+biases) after each action; 'exit' once the region exits")
    for order in ("gpipe", "1f1b"):
        for received in (True, False):
            for per_mb in (True, False):
                got = cast_lifetimes(torch, a.layers, a.width, a.microbatches, per_mb, order, received)
                want = expected_lifetimes(a.layers, a.microbatches, per_mb, order, received)
                name = "per micro-batch" if per_mb else "one region"
                where = "received input" if received else "first stage"
                cells = " ".join(f"{act}:{w}+{b}" for act, (w, b) in got[0])
                print(f"  {order:5s} {where:14s} {name:16s} {cells} exit:{got[1][0]}+{got[1][1]}"
                      + ("" if got == want else "  (model differs)"))
                bad |= got != want
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

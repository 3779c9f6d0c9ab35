#!/usr/bin/env python3
"""torch.distributed.pipelining with checkpoint-wrapped blocks: what each stage saves and holds.

The model is the seed's pipeline MLP (Linear(width, width) with bias and ReLU after every
layer, MSE against a (batch, width) target, fp32 on the CPU), --layers of them cut into
S·v virtual stages (torch.tensor_split sizes, as shardscope cuts them); virtual stage k
lives on rank k % S. Layer c (counted over the whole model from its first) is wrapped in
torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False) when c mod K = 0
(--checkpoint full: K = 1; every:K), as shardscope's --checkpoint does inside a stage.
torch's ScheduleGPipe, Schedule1F1B or ScheduleInterleaved1F1B (--schedule) runs one step
of --microbatches micro-batches over gloo, one process per rank (torch.multiprocessing);
the first step infers the stages' shapes, the second is measured.

Per rank, over the measured step:
  saves seen by saved_tensors_hooks around the step (as bench/torch_zbv.py counts them):
    peak_live_bytes   the most bytes held at once by distinct saved tensors (parameters,
                      saved as weights, hold none); before_first_backward: saves before
                      the rank's first unpack; total_tensors. A wrapped layer's forward
                      saves only what checkpoint's _NoopSaveInputs keeps (its input and an
                      empty tensor: 2 saves, the input's bytes); its re-run's saves go to
                      the checkpoint's own hooks, which these do not see.
  live bytes: every tensor an op makes during the step (a TorchDispatchMode; weak
    references to the storages), parameters and gradients aside (and the parameters'
    gradients as autograd makes them before AccumulateGrad adds them in place: shardscope's
    GEMMs write onto the gradient), the most alive at once above the step's start
    (pipelining's receive buffers, made at the first step, and the batch are not counted).
With --casts, no pipeline: one stage of --layers checkpoint-wrapped Linear(width, width)
under torch.autocast(bfloat16) runs GPipe's order of --microbatches micro-batches (its input
received: every Linear's input needs a gradient), the autocast region around each
micro-batch's forward or one region around the whole step (--autocast-region step), and
prints how many parameter casts were made and how many live after each action (a
TorchDispatchMode on the parameters' bf16 _to_copy, weak references to the casts):
  per micro-batch  each F makes every weight's and bias's cast (2L), none outlives the F's
                   region (the wrapped layers' saves are dropped); each B's re-runs make
                   them again, each in its own region: 4LM casts, none live between actions;
  one region       F(0) makes 2L, every later F and every re-run none (the cast cache's,
                   still open around the backward), all 2L live to the region's exit.

With --shardscope BINARY, runs `mpirun -np S BINARY run --schedule ... --checkpoint ...` on
the same shape and prints its stage records (saved peak bytes and its peak of activation,
temp and comm above its resting bytes) beside torch's.

Exit status 0; 1 when --casts counts casts other than the model above; 2 when torch cannot
be imported.
torch is a dependency of this script only (a bench), never of the build or its tests.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import weakref


def split_sizes(n, parts):
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


def wraps(checkpoint, c):
    if checkpoint == "none":
        return False
    k = 1 if checkpoint == "full" else int(checkpoint.split(":")[1])
    return c % k == 0


def worker(rank, args, port, out_dir):
    import torch
    import torch.distributed as dist
    from torch.distributed import pipelining as pp
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.checkpoint import checkpoint

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    S, v = args.ranks, args.chunks
    V = S * v
    torch.manual_seed(args.seed)

    class Wrapped(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return checkpoint(self.inner, x, use_reentrant=False)

    layers = []
    for c in range(args.layers):
        layer = torch.nn.Sequential(torch.nn.Linear(args.width, args.width), torch.nn.ReLU())
        layers.append(Wrapped(layer) if wraps(args.checkpoint, c) else layer)
    bounds = [0]
    for n in split_sizes(args.layers, V):
        bounds.append(bounds[-1] + n)
    pieces = [torch.nn.Sequential(*layers[bounds[k]:bounds[k + 1]]) for k in range(V)]
    mine = [c * S + rank for c in range(v)]
    params = set()
    for k in mine:
        params.update(p.untyped_storage().data_ptr() for p in pieces[k].parameters())
    stages = [pp.PipelineStage(pieces[k], k, V, torch.device("cpu")) for k in mine]
    loss = torch.nn.MSELoss()
    if args.schedule == "gpipe":
        schedule = pp.ScheduleGPipe(stages[0], args.microbatches, loss_fn=loss)
    elif args.schedule == "1f1b":
        schedule = pp.Schedule1F1B(stages[0], args.microbatches, loss_fn=loss)
    else:
        schedule = pp.ScheduleInterleaved1F1B(stages, args.microbatches, loss_fn=loss)

    x = torch.rand(args.batch, args.width) * 2 - 1
    target = torch.rand(args.batch, args.width)

    live = {}
    refs = {}
    state = {"saves": 0, "before": None, "bytes": 0, "peak_bytes": 0}

    class Holder:
        __slots__ = ("t", "__weakref__")

        def __init__(self, t):
            self.t = t

    def dropped(hid):
        key, nbytes = live.pop(hid)
        refs[key] -= 1
        if refs[key] == 0:
            del refs[key]
            state["bytes"] -= nbytes

    def pack(t):
        h = Holder(t)
        key = (t.data_ptr(), t.numel() * t.element_size())
        nbytes = 0 if t.untyped_storage().data_ptr() in params else key[1]
        live[id(h)] = (key, nbytes)
        if refs.get(key, 0) == 0:
            state["bytes"] += nbytes
        refs[key] = refs.get(key, 0) + 1
        state["saves"] += 1
        state["peak_bytes"] = max(state["peak_bytes"], state["bytes"])
        weakref.finalize(h, dropped, id(h))
        return h

    def unpack(h):
        if state["before"] is None:
            state["before"] = state["saves"]
        return h.t

    grads = set()
    param_shapes = {tuple(p.shape) for k in mine for p in pieces[k].parameters()}

    class LiveBytes(TorchDispatchMode):
        """Every storage an op makes during the step, until it dies: the most alive at once."""

        def __init__(self):
            super().__init__()
            self.made = {}  # data_ptr -> (weak ref, bytes)
            self.peak = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in (out if isinstance(out, (tuple, list)) else [out]):
                if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                    st = t.untyped_storage()
                    ptr = st.data_ptr()
                    if ptr in params or ptr in grads or ptr in self.made or st.nbytes() == 0:
                        continue
                    if tuple(t.shape) in param_shapes:  # a weight's or bias's gradient, added in place
                        continue
                    self.made[ptr] = (StorageWeakRef(st), st.nbytes())
            for ptr in [p for p, (ref, _) in self.made.items() if ref.expired()]:
                del self.made[ptr]
            self.peak = max(self.peak, sum(n for _, n in self.made.values()))
            return out

    def step():
        kwargs = {}
        if rank == (V - 1) % S:
            kwargs = {"target": target, "losses": []}
        if rank == 0:
            schedule.step(x, **kwargs)
        else:
            schedule.step(**kwargs)

    step()  # infers the stages' shapes
    for k in mine:
        for p in pieces[k].parameters():
            if p.grad is not None:
                grads.add(p.grad.untyped_storage().data_ptr())
    dist.barrier()
    mode = LiveBytes()
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack), mode:
        step()
    dist.barrier()
    result = {"rank": rank, "peak_live_bytes": state["peak_bytes"], "total_tensors": state["saves"],
              "before_first_backward": state["before"], "live_peak": mode.peak, "torch": torch.__version__}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


def step_casts(args):
    """Casts made and live after each action of a checkpointed stage under autocast."""
    import contextlib

    import torch
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    layers = [torch.nn.Linear(args.width, args.width) for _ in range(args.layers)]
    params = {p.data_ptr(): p.dim() for layer in layers for p in layer.parameters()}
    casts = []

    class Casts(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args_=(), kwargs=None):
            out = func(*args_, **(kwargs or {}))
            if (func is torch.ops.aten._to_copy.default and out.dtype == torch.bfloat16
                    and args_[0].data_ptr() in params):
                casts.append(StorageWeakRef(out.untyped_storage()))
            return out

    def stage(x):
        for layer in layers:
            x = checkpoint(layer, x, use_reentrant=False)
        return x

    def live():
        return len({r.cdata for r in casts if not r.expired()})

    per_mb = args.autocast_region == "microbatch"
    order = [("F", i) for i in range(args.microbatches)] + [("B", i) for i in range(args.microbatches)]
    trace, outs = [], {}
    region = contextlib.nullcontext() if per_mb else torch.autocast("cpu", dtype=torch.bfloat16)
    with Casts(), region:
        for kind, i in order:
            if kind == "F":
                x = torch.randn(2, args.width, requires_grad=True)
                with torch.autocast("cpu", dtype=torch.bfloat16) if per_mb else contextlib.nullcontext():
                    outs[i] = stage(x).float().sum()
            else:
                outs.pop(i).backward()
            trace.append(f"{kind}{i}:{live()}")
    L, M = args.layers, args.microbatches
    want_made = 4 * L * M if per_mb else 2 * L
    print(f"torch {torch.__version__}: {L} checkpoint-wrapped Linear({args.width}, {args.width}) under autocast, "
          f"GPipe's order of {M} micro-batches, autocast region {args.autocast_region}")
    print(f"  casts made {len(casts)} (model {want_made}); live after each action: {' '.join(trace)}; "
          f"after the region: {live()}")
    return 0 if len(casts) == want_made else 1


def shardscope_figures(binary, args):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "run.json")
        cmd = ["mpirun", "-np", str(args.ranks), "--oversubscribe", binary, "run", "--schedule", args.schedule,
               "--chunks", str(args.chunks), "--microbatches", str(args.microbatches), "--layers", str(args.layers),
               "--width", str(args.width), "--batch", str(args.batch), "--activation", "relu", "--loss", "mse",
               "--checkpoint", args.checkpoint, "--steps", "1", "--json", path]
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OPENBLAS_NUM_THREADS="1")
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
        with open(path) as f:
            doc = json.load(f)
    runs = doc["runs"] if "runs" in doc else [doc]
    out = {}
    for st in runs[0]["stages"]:
        s = st["saved"]
        peak = st["peak"]["by_category"]
        out[st["stage"]] = {"peak_live_bytes": s["peak_live_bytes"], "total_tensors": s["total_tensors"],
                            "before_first_backward": s["before_first_backward"],
                            "transient": sum(peak.get(c, 0) for c in ("activation", "temp", "comm")),
                            "predicted_equal": st["peak"]["total"] == st["predicted"]["peak_total"]}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2, help="pipeline ranks S (default 2)")
    ap.add_argument("--schedule", choices=["gpipe", "1f1b", "interleaved-1f1b"], default="1f1b")
    ap.add_argument("--chunks", type=int, default=1, help="v (interleaved-1f1b: 2)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--microbatches", type=int, default=4, help="M, dividing --batch (default 4)")
    ap.add_argument("--checkpoint", default="full", help="none, full or every:K (default full)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shardscope", metavar="BINARY", help="run shardscope on the same shape beside torch")
    ap.add_argument("--casts", action="store_true", help="the cast cache of a checkpointed stage (no pipeline)")
    ap.add_argument("--autocast-region", choices=["microbatch", "step"], default="microbatch")
    args = ap.parse_args()
    if args.casts:
        try:
            return step_casts(args)
        except ImportError as e:
            print(f"torch_pipeline_checkpoint.py: PyTorch is not installed ({e})", file=sys.stderr)
            return 2
    if args.schedule == "interleaved-1f1b" and args.chunks < 2:
        args.chunks = 2
    if args.batch % args.microbatches or args.layers < args.ranks * args.chunks:
        print("torch_pipeline_checkpoint.py: needs --microbatches dividing --batch, --layers >= S·v", file=sys.stderr)
        return 2
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError as e:
        print(f"torch_pipeline_checkpoint.py: PyTorch is not installed ({e})", file=sys.stderr)
        return 2

    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(worker, args=(args, port, d), nprocs=args.ranks, join=True)
        ranks = []
        for r in range(args.ranks):
            with open(os.path.join(d, f"rank{r}.json")) as f:
                ranks.append(json.load(f))
    ours = shardscope_figures(args.shardscope, args) if args.shardscope else None
    print(f"torch {ranks[0]['torch']} {args.schedule}, S={args.ranks} v={args.chunks} M={args.microbatches}: "
          f"{args.layers} x {args.width}, relu, mse, batch {args.batch}, --checkpoint {args.checkpoint}")
    for r in ranks:
        line = (f"rank {r['rank']}: torch saved peak {r['peak_live_bytes']} B, total {r['total_tensors']}, "
                f"before first backward {r['before_first_backward']}; live peak {r['live_peak']} B")
        if ours is not None:
            o = ours[r["rank"]]
            line += (f" | shardscope saved peak {o['peak_live_bytes']} B, total {o['total_tensors']}, before "
                     f"first backward {o['before_first_backward']}; activation+temp+comm at its peak "
                     f"{o['transient']} B (predicted {'=' if o['predicted_equal'] else 'DIFFERENT'})")
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

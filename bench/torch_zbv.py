#!/usr/bin/env python3
"""torch's own ScheduleZBVZeroBubble on the seed's MLP: what each stage saves for backward.

The model is the seed's (Linear(width, width) with bias and ReLU after every layer, MSE
against a (batch, width) target, fp32 on the CPU), --layers of them cut into the 2S
virtual stages of zbv's V (torch.tensor_split sizes, as shardscope cuts them): rank r
holds virtual stages r and 2S-1-r as two torch.distributed.pipelining.PipelineStage's,
ScheduleZBVZeroBubble runs one step of --microbatches micro-batches over gloo, one
process per rank (torch.multiprocessing, S = --ranks). The first step infers the
stages' shapes (a forward of its own); the second is measured.

Every tensor autograd saves on a rank passes through torch.autograd.graph.
saved_tensors_hooks; each packed save is tracked until autograd drops it (a weakref
finalizer on the packed holder), so each rank's figures over the step are those of
shardscope's saved-tensor instrument (docs/design.md §2):
  peak_live_tensors   the most saves held at once;
  peak_live_bytes     the most bytes held at once by distinct tensors (a tensor saved
                      twice counts once; parameters, saved as weights, hold no bytes);
  total_tensors       saves over the step;
  before_first_backward  saves before the rank's first backward (first unpack).
With --shardscope BINARY, runs `mpirun -np S BINARY run --schedule zbv ...` on the same
shape and prints its stage records' figures beside torch's. The schedule's own op order
(torch's _calculate_single_rank_operations) is printed per rank with --order.

Prints one line per rank:
  rank r: torch peak <n> saves / <bytes> B, total <n>, before first backward <n>
      [shardscope ..., equal|DIFFERENT]
Exit status 0; 1 when a shardscope figure differs; 2 when torch cannot be imported.
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


def worker(rank, args, port, out_dir):
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, ScheduleZBVZeroBubble

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    S, V = args.ranks, 2 * args.ranks
    torch.manual_seed(args.seed)
    layers = [torch.nn.Sequential(torch.nn.Linear(args.width, args.width), torch.nn.ReLU())
              for _ in range(args.layers)]
    bounds = [0]
    for n in split_sizes(args.layers, V):
        bounds.append(bounds[-1] + n)
    pieces = [torch.nn.Sequential(*layers[bounds[k]:bounds[k + 1]]) for k in range(V)]
    mine = [rank, V - 1 - rank]  # zbv's V: chunk 0, chunk 1
    # Storages of the rank's parameters: a Linear saves its weight as a view (weight.t()).
    params = set()
    for k in mine:
        params.update(p.untyped_storage().data_ptr() for p in pieces[k].parameters())
    stages = [PipelineStage(pieces[k], k, V, torch.device("cpu"))
              for k in mine]
    schedule = ScheduleZBVZeroBubble(stages, args.microbatches, loss_fn=torch.nn.MSELoss())
    order = [str(a) for a in schedule.pipeline_order[rank] if a is not None]

    x = torch.rand(args.batch, args.width) * 2 - 1
    target = torch.rand(args.batch, args.width)

    live = {}      # id(holder) -> (key, bytes)
    refs = {}      # key -> number of live saves of that tensor
    state = {"saves": 0, "before": None, "peak_live": 0, "peak_bytes": 0, "bytes": 0}

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
        is_param = t.untyped_storage().data_ptr() in params
        key = (t.data_ptr(), t.numel() * t.element_size())
        nbytes = 0 if is_param else key[1]
        live[id(h)] = (key, nbytes)
        if refs.get(key, 0) == 0:
            state["bytes"] += nbytes
        refs[key] = refs.get(key, 0) + 1
        state["saves"] += 1
        state["peak_live"] = max(state["peak_live"], len(live))
        state["peak_bytes"] = max(state["peak_bytes"], state["bytes"])
        weakref.finalize(h, dropped, id(h))
        return h

    def unpack(h):
        if state["before"] is None:
            state["before"] = state["saves"]
        return h.t

    def step():
        if rank == 0:  # the first virtual stage and the last (the loss) are both here
            schedule.step(x, target=target, losses=[])
        else:
            schedule.step()

    # The first step also infers the stages' shapes (one more forward with autograd on):
    # the measured step is the second, as shardscope reports its last.
    step()
    dist.barrier()
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        step()
    dist.barrier()
    result = {"rank": rank, "peak_live_tensors": state["peak_live"], "peak_live_bytes": state["peak_bytes"],
              "total_tensors": state["saves"], "before_first_backward": state["before"],
              "live_after_step": len(live), "order": order, "torch": torch.__version__}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


def shardscope_figures(binary, args):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "zbv.json")
        cmd = ["mpirun", "-np", str(args.ranks), "--oversubscribe", binary, "run", "--schedule", "zbv",
               "--microbatches", str(args.microbatches), "--layers", str(args.layers), "--width", str(args.width),
               "--batch", str(args.batch), "--activation", "relu", "--loss", "mse", "--steps", "1",
               "--json", path]
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OPENBLAS_NUM_THREADS="1")
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
        with open(path) as f:
            doc = json.load(f)
    runs = doc["runs"] if "runs" in doc else [doc]
    out = {}
    for st in runs[0]["stages"]:
        s = st["saved"]
        out[st["stage"]] = {"peak_live_tensors": s["peak_live_tensors"], "peak_live_bytes": s["peak_live_bytes"],
                            "total_tensors": s["total_tensors"], "before_first_backward": s["before_first_backward"]}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2, help="pipeline ranks S (default 2)")
    ap.add_argument("--layers", type=int, default=4, help="Linear+ReLU layers, >= 2S (default 4)")
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--microbatches", type=int, default=4, help="M, dividing --batch, >= 2S-1 (default 4)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--order", action="store_true", help="print each rank's op order")
    ap.add_argument("--shardscope", metavar="BINARY", help="run shardscope on the same shape beside torch")
    args = ap.parse_args()
    if args.layers < 2 * args.ranks or args.batch % args.microbatches or args.microbatches < 2 * args.ranks - 1:
        print("torch_zbv.py: needs --layers >= 2S, --microbatches >= 2S-1 dividing --batch", file=sys.stderr)
        return 2
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError as e:
        print(f"torch_zbv.py: PyTorch is not installed ({e})", file=sys.stderr)
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
    print(f"torch {ranks[0]['torch']} ScheduleZBVZeroBubble, S={args.ranks} M={args.microbatches}: "
          f"{args.layers} x {args.width}, relu, mse, batch {args.batch}")
    status = 0
    keys = ["peak_live_tensors", "peak_live_bytes", "total_tensors", "before_first_backward"]
    for r in ranks:
        line = (f"rank {r['rank']}: torch peak {r['peak_live_tensors']} saves / {r['peak_live_bytes']} B, "
                f"total {r['total_tensors']}, before first backward {r['before_first_backward']}"
                f" (left after the step: {r['live_after_step']})")
        if ours is not None:
            o = ours[r["rank"]]
            same = all(o[k] == r[k] for k in keys)
            status |= 0 if same else 1
            line += (f"; shardscope peak {o['peak_live_tensors']} saves / {o['peak_live_bytes']} B, total "
                     f"{o['total_tensors']}, before first backward {o['before_first_backward']}, "
                     f"{'equal' if same else 'DIFFERENT'}")
        print(line)
        if args.order:
            print("  " + " ".join(r["order"]))
    return status


if __name__ == "__main__":
    sys.exit(main())

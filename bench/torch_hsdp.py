#!/usr/bin/env python3
"""torch's HSDP (FSDP1 HYBRID_SHARD, fully_shard on a 2-D mesh) beside --strategy hsdp, rank by rank.

PyTorch runs the seed's model (docs/design.md §2: L x (Linear(w, w) + ReLU), MSE against
ones, torch.optim.AdamW with its defaults; 8 x 256, batch 32 per rank, 3 steps) on CPU
under gloo, one process per rank, on a DeviceMesh of shape (W / G, G) named
("replicate", "shard"): mesh dim 1, the fastest, is the shard group, so rank r shards
with the G consecutive ranks floor(r / G) * G ... + G - 1 and replicates with the ranks
G apart (init_device_mesh's row-major layout; FSDP1 without a mesh makes the same
groups from the ranks of a node). Per rank it reports
  groups     the members of the rank's shard and replicate groups, as torch made them;
  resting    c10's allocator count after step 3 (bench/torch_peaks.py explains the
             log) and the storages of the parameters, their gradients and AdamW's state;
  peak       the high-water mark during step 3 and its phase;
  comm       every collective step 3 issued through torch.distributed, by group
             (shard / replicate) and kind, in nccl-tests' sizes as shardscope's ledger
             counts them: all-reduce the buffer, reduce-scatter its whole input,
             all-gather its whole output.
shardscope runs the same configuration with `--strategy hsdp --shard-group G --emulate W:r`
for every rank (fsdp2's: `--engine fsdp2`, which shardscope refuses with hsdp; torch's
figures are printed alone).

Usage: bench/torch_hsdp.py [--world 4] [--shard-group 2] [--configs NAME,...] [--json FILE]
Environment: SHARDSCOPE  the binary (default build/shardscope)
Configurations (torch  <->  shardscope flags):
  hybrid-unit   FSDP1, each Linear wrapped, HYBRID_SHARD        --strategy hsdp --units 1
  hybrid-root   FSDP1, no wrap policy, HYBRID_SHARD             --strategy hsdp --units all
  fsdp2-unit    fully_shard on each Linear, then the root, 2-D mesh, reshard_after_forward
                True                                            --strategy hsdp --units 1 --engine fsdp2
"""
import argparse
import collections
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_peaks  # noqa: E402  (the allocator log and the driver's helpers)

LAYERS, WIDTH, BATCH, STEPS = torch_peaks.LAYERS, torch_peaks.WIDTH, torch_peaks.BATCH, torch_peaks.STEPS
MARK = torch_peaks.MARK

CONFIGS = {
    "hybrid-unit": ["--strategy", "hsdp", "--units", "1"],
    "hybrid-root": ["--strategy", "hsdp", "--units", "all"],
    "fsdp2-unit": ["--strategy", "hsdp", "--units", "1", "--engine", "fsdp2"],
}


def build(config, mesh, torch):
    mods = []
    for _ in range(LAYERS):
        mods += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    model = torch.nn.Sequential(*mods)
    if config == "fsdp2-unit":
        from torch.distributed.fsdp import fully_shard
        for m in model:
            if isinstance(m, torch.nn.Linear):
                fully_shard(m, mesh=mesh, reshard_after_forward=True)
        fully_shard(model, mesh=mesh, reshard_after_forward=True)
    else:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        policy = ModuleWrapPolicy({torch.nn.Linear}) if config == "hybrid-unit" else None
        model = FSDP(model, sharding_strategy=ShardingStrategy.HYBRID_SHARD, auto_wrap_policy=policy,
                     device_mesh=mesh, device_id=torch.device("cpu"))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


class Ledger:
    """Counts every collective issued through torch.distributed, per group and kind."""

    # kind, and how its nccl-tests size follows from (output, input) tensors and the group's size
    WRAPPED = {
        "all_reduce": ("all_reduce", lambda a, w: a[0].numel() * a[0].element_size()),
        "reduce_scatter_single": ("reduce_scatter", lambda a, w: a[1].numel() * a[1].element_size()),
        "reduce_scatter_tensor": ("reduce_scatter", lambda a, w: a[1].numel() * a[1].element_size()),
        "all_gather_single": ("all_gather", lambda a, w: a[0].numel() * a[0].element_size()),
        "all_gather_into_tensor": ("all_gather", lambda a, w: a[0].numel() * a[0].element_size()),
        "all_gather": ("all_gather", lambda a, w: sum(t.numel() * t.element_size() for t in a[0])),
        "broadcast": ("broadcast", lambda a, w: a[0].numel() * a[0].element_size()),
    }

    def __init__(self, dist, names):
        self.dist, self.names = dist, names  # names: tuple of member ranks -> "shard" / "replicate"
        self.counts = collections.defaultdict(lambda: {"calls": 0, "bytes": 0})
        for fn, (kind, size) in self.WRAPPED.items():
            if hasattr(dist, fn):
                setattr(dist, fn, self.wrap(getattr(dist, fn), kind, size))

    def wrap(self, f, kind, size):
        def counted(*args, **kwargs):
            group = kwargs.get("group")
            members = tuple(self.dist.get_process_group_ranks(group)) if group is not None else \
                tuple(range(self.dist.get_world_size()))
            name = self.names.get(members, "world" if len(members) == self.dist.get_world_size() else str(members))
            tensors = list(args) + [kwargs[k] for k in ("output", "input", "tensor", "output_tensor",
                                                         "input_tensor", "tensor_list") if k in kwargs]
            c = self.counts[(name, kind)]
            c["calls"] += 1
            c["bytes"] += size(tensors, len(members))
            return f(*args, **kwargs)
        return counted

    def reset(self):
        self.counts.clear()

    def figures(self):
        out = collections.defaultdict(dict)
        for (name, kind), c in self.counts.items():
            out[name][kind] = dict(c)
        return out


def worker(args):
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=args.rank, world_size=args.world)
    torch.manual_seed(args.rank)
    G = args.shard_group
    mesh = init_device_mesh("cpu", (args.world // G, G), mesh_dim_names=("replicate", "shard"))
    groups = {name: dist.get_process_group_ranks(mesh.get_group(name)) for name in ("shard", "replicate")}
    ledger = Ledger(dist, {tuple(m): name for name, m in groups.items()})
    c10 = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
    ctypes.c_bool.in_dll(c10, "FLAGS_caffe2_report_cpu_memory_usage").value = True

    def mark(name):
        os.write(2, f"{MARK} {name}\n".encode())

    model, opt = build(args.config, mesh, torch)
    for _ in range(STEPS):
        ledger.reset()
        mark("step")
        x = torch.rand(BATCH, WIDTH) * 2 - 1
        target = torch.ones(BATCH, WIDTH)
        opt.zero_grad(set_to_none=False)
        mark("forward")
        loss = torch.nn.functional.mse_loss(model(x), target)
        mark("backward")
        loss.backward()
        mark("optimizer")
        opt.step()
        del x, target, loss
        mark("end")
    ctypes.c_bool.in_dll(c10, "FLAGS_caffe2_report_cpu_memory_usage").value = False
    comm = ledger.figures()
    # What the resting bytes are made of, storage by storage (deduplicated).
    seen, parts = set(), {"param": 0, "grad": 0, "optim": 0}

    def local(t):
        return t._local_tensor if hasattr(t, "_local_tensor") else t

    for p in model.parameters():
        for part, t in (("param", p), ("grad", p.grad)):
            if t is None:
                continue
            s = local(t).untyped_storage()
            if s.nbytes() and s.data_ptr() not in seen:
                seen.add(s.data_ptr())
                parts[part] += s.nbytes()
        for v in opt.state[p].values():
            s = local(v).untyped_storage()
            if s.nbytes() and s.data_ptr() not in seen:
                seen.add(s.data_ptr())
                parts["optim"] += s.nbytes()
    with open(os.path.join(args.out, f"rank{args.rank}.json"), "w") as f:
        json.dump({"storages": parts, "groups": groups, "comm": comm}, f)
    dist.destroy_process_group()


def torch_ranks(config, world, G, tmp):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(torch_peaks.free_port()),
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               TORCH_CPP_LOG_LEVEL="INFO")
    logs = [os.path.join(tmp, f"log{r}.txt") for r in range(world)]
    procs = []
    for r in range(world):
        with open(logs[r], "w") as log:
            procs.append(subprocess.Popen(
                [sys.executable, __file__, "--worker", "--config", config, "--world", str(world),
                 "--shard-group", str(G), "--rank", str(r), "--out", tmp],
                env=env, stdout=subprocess.DEVNULL, stderr=log))
    errors = []
    for r, p in enumerate(procs):
        try:
            p.wait(timeout=600)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise RuntimeError(f"torch {config} W={world}: rank {r} did not finish in 600 s")
        if p.returncode != 0:
            tail = [l.strip() for l in open(logs[r], errors="replace") if "C10 " not in l][-3:]
            errors.append(f"rank {r}: exit {p.returncode}: {' '.join(tail)}")
    if errors:
        raise RuntimeError(f"torch {config} W={world}: " + "; ".join(errors))
    out = []
    for r in range(world):
        ranked = json.load(open(os.path.join(tmp, f"rank{r}.json")))
        ranked.update(torch_peaks.allocator_figures(logs[r]))
        out.append(ranked)
    return out


def shardscope_ranks(binary, config, world, G, tmp):
    """Every rank's record, or (None, the refusal) when shardscope refuses the flags."""
    out = []
    for r in range(world):
        path = os.path.join(tmp, f"ss{r}.json")
        cmd = [binary, "run", "--backend", "cpu", "--layers", str(LAYERS), "--width", str(WIDTH),
               "--batch", str(BATCH), "--activation", "relu", "--loss", "mse", "--steps", str(STEPS),
               "--shard-group", str(G), "--emulate", f"{world}:{r}", "--json", path] + CONFIGS[config]
        p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if p.returncode == 2:
            return None, p.stderr.strip()
        if p.returncode != 0:
            raise RuntimeError(f"shardscope {config} rank {r}: exit {p.returncode}: {p.stderr.strip()}")
        out.append(json.load(open(path))["runs"][0]["ranks"][0])
    return out, None


def ours_comm(rank):
    """A shardscope rank's comm_groups as {group: {kind: {calls, bytes}}} (nonzero kinds)."""
    out = {}
    for g in rank.get("comm_groups", []) if isinstance(rank.get("comm_groups"), list) else []:
        out[g["axis"]] = g
    if isinstance(rank.get("comm_groups"), dict):
        out = rank["comm_groups"]
    return {name: {k: {"calls": v["calls"], "bytes": v["bytes"]} for k, v in g["comm"].items() if v["calls"]}
            for name, g in out.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--shard-group", type=int, default=2)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--json", help="write every figure here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    binary = os.environ.get("SHARDSCOPE", os.path.join(root, "build", "shardscope"))
    W, G = args.world, args.shard_group
    if not 1 <= W <= 8 or G < 1 or W % G:
        sys.exit("torch_hsdp: --world must be 1 to 8 and --shard-group must divide it")
    configs = args.configs.split(",")
    for c in configs:
        if c not in CONFIGS:
            sys.exit(f"torch_hsdp: --configs: unknown {c!r}; known: {', '.join(CONFIGS)}")
    if not os.access(binary, os.X_OK):
        sys.exit(f"torch_hsdp: no shardscope binary at {binary} (build it, or set SHARDSCOPE)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torch
    except ImportError:
        sys.exit(f"torch_hsdp: PyTorch is not importable by {sys.executable}")

    print(f"torch {torch.__version__} (CPU, gloo) HSDP beside {binary}; W = {W}, shard groups of {G}; "
          f"model {LAYERS} x {WIDTH}, ReLU after every layer, MSE, batch {BATCH}/rank, AdamW, step {STEPS}")
    records = []
    mismatches = 0
    for config in configs:
        with tempfile.TemporaryDirectory() as tmp:
            theirs = torch_ranks(config, W, G, tmp)
            ours, refused = shardscope_ranks(binary, config, W, G, tmp)
        print(f"\n{config}, W = {W}, G = {G}   ({' '.join(CONFIGS[config])} --shard-group {G})")
        if refused:
            print(f"  shardscope refuses it: {refused}")
        print(f"  {'rank':>4}  {'shard':>9} {'replicate':>9}  {'torch rest':>11} {'ours rest':>11}  "
              f"{'torch peak':>11} {'ours peak':>11}  phases (torch / ours)   torch's storages (param / grad / optim)")
        for r, t in enumerate(theirs):
            o = ours[r] if ours else None
            s = t["storages"]
            print(f"  {r:>4}  {','.join(map(str, t['groups']['shard'])):>9} "
                  f"{','.join(map(str, t['groups']['replicate'])):>9}  {t['resting']:>11,} "
                  f"{(format(o['resting']['total'], ',') if o else '-'):>11}  {t['peak']:>11,} "
                  f"{(format(o['peak']['total'], ',') if o else '-'):>11}  "
                  f"{t['phase']} / {o['peak']['phase'] + ', ' + o['peak']['where'] if o else '-'}   "
                  f"{s['param']:,} / {s['grad']:,} / {s['optim']:,}")
            mine = ours_comm(o) if o else {}
            for group in ("shard", "replicate"):
                for kind in sorted(set(t["comm"].get(group, {})) | set(mine.get(group, {}))):
                    tc = t["comm"].get(group, {}).get(kind, {"calls": 0, "bytes": 0})
                    oc = mine.get(group, {}).get(kind)
                    same = oc is not None and oc == tc
                    mismatches += 0 if (same or not o) else 1
                    print(f"        {group:>9} {kind:<15} torch {tc['calls']:>3} calls {tc['bytes']:>11,} B"
                          + (f"   ours {oc['calls']:>3} calls {oc['bytes']:>11,} B" if oc else
                             ("   ours none" if o else "")) + ("" if same or not o else "   DIFFERS"))
            for other in set(t["comm"]) - {"shard", "replicate"}:
                print(f"        torch also: {other} {t['comm'][other]}")
            records.append({"config": config, "world": W, "shard_group": G, "rank": r, "torch": t,
                            "shardscope": None if not o else
                            {"resting": o["resting"], "peak": o["peak"], "comm_groups": mine},
                            "refused": refused})
    if args.json:
        tmp_path = args.json + ".tmp"
        with open(tmp_path, "w") as f:
            json.dump({"torch": torch.__version__, "records": records}, f, indent=1)
        os.replace(tmp_path, args.json)
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""torch's FSDP2 (fully_shard) beside shardscope's --engine fsdp2, rank by rank.

PyTorch runs the seed's model (docs/design.md §2: L x (Linear(w, w) + ReLU), MSE against
ones, torch.optim.AdamW with its defaults; 8 x 256, batch 32 per rank, 3 steps) on CPU
under gloo, one process per rank, with fully_shard applied as --units says: on every
group of K Linear layers (a ModuleList of them wrapped once) and then on the root, or on
the root alone (--units all). reshard_after_forward is False for zero2, True for zero3
(fully_shard leaves the root's parameters gathered after forward either way).
c10's CPU allocator logs every allocation and free (bench/torch_peaks.py explains the
log); from it come
  resting  bytes live after step 3: the padded sharded parameters (each rank's
           _sharded_param_data holds ceil(dim0 / W) rows of every tensor), the
           gradients (views of each group's padded reduce-scatter output), AdamW's
           exp_avg and exp_avg_sq (zeros_like of the unpadded local shard) and one
           4-byte step per parameter tensor;
  peak     the high-water mark during step 3, and its phase.
shardscope runs the same configuration with `--engine fsdp2 --emulate W:r` for every rank.

Usage: bench/torch_fsdp2.py [--worlds 2,3,4] [--configs NAME,...] [--torch-only] [--json FILE]
Environment: SHARDSCOPE  the binary (default build/shardscope)
Configurations (torch  <->  shardscope flags, each with --engine fsdp2):
  zero2-unit   fully_shard per Linear, reshard_after_forward=False   --strategy zero2 --units 1
  zero3-unit   fully_shard per Linear, reshard_after_forward=True    --strategy zero3 --units 1
  zero3-unit2  fully_shard per 2 Linears, reshard_after_forward=True --strategy zero3 --units 2
  zero2-root   fully_shard on the root alone                          --strategy zero2 --units all
"""
import argparse
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
    "zero2-unit": (["--strategy", "zero2", "--units", "1"], False, 1),
    "zero3-unit": (["--strategy", "zero3", "--units", "1"], True, 1),
    "zero3-unit2": (["--strategy", "zero3", "--units", "2"], True, 2),
    "zero2-root": (["--strategy", "zero2", "--units", "all"], False, 0),
}


def build(config, torch):
    from torch.distributed.fsdp import fully_shard
    _, reshard, k = CONFIGS[config]
    mods = []
    for _ in range(LAYERS):
        mods += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    model = torch.nn.Sequential(*mods)
    if k > 0:
        linears = [m for m in model if isinstance(m, torch.nn.Linear)]
        for first in range(0, LAYERS, k):
            group = linears[first:first + k]
            # One FSDP parameter group over these layers: fully_shard takes a list of modules.
            fully_shard(group if len(group) > 1 else group[0], reshard_after_forward=reshard)
    fully_shard(model, reshard_after_forward=reshard)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def worker(args):
    warnings.filterwarnings("ignore")
    import ctypes
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=args.rank, world_size=args.world)
    torch.manual_seed(args.rank)
    c10 = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
    ctypes.c_bool.in_dll(c10, "FLAGS_caffe2_report_cpu_memory_usage").value = True

    def mark(name):
        os.write(2, f"{MARK} {name}\n".encode())

    model, opt = build(args.config, torch)
    for _ in range(STEPS):
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
    # What the resting bytes are made of, storage by storage (deduplicated).
    seen, parts = set(), {"param": 0, "grad": 0, "optim": 0}
    for p in model.parameters():
        for part, t in (("param", p), ("grad", p.grad)):
            if t is None:
                continue
            s = t._local_tensor.untyped_storage()
            if s.data_ptr() not in seen:
                seen.add(s.data_ptr())
                parts[part] += s.nbytes()
        for v in opt.state[p].values():
            t = v._local_tensor if hasattr(v, "_local_tensor") else v
            s = t.untyped_storage()
            if s.nbytes() and s.data_ptr() not in seen:
                seen.add(s.data_ptr())
                parts["optim"] += s.nbytes()
    with open(os.path.join(args.out, f"rank{args.rank}.json"), "w") as f:
        json.dump({"storages": parts}, f)
    dist.destroy_process_group()


def torch_ranks(config, world, tmp):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(torch_peaks.free_port()),
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               TORCH_CPP_LOG_LEVEL="INFO")
    logs = [os.path.join(tmp, f"log{r}.txt") for r in range(world)]
    procs = []
    for r in range(world):
        with open(logs[r], "w") as log:
            procs.append(subprocess.Popen(
                [sys.executable, __file__, "--worker", "--config", config, "--world", str(world),
                 "--rank", str(r), "--out", tmp], env=env, stdout=subprocess.DEVNULL, stderr=log))
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


def shardscope_ranks(binary, config, world, tmp):
    out = []
    for r in range(world):
        path = os.path.join(tmp, f"ss{r}.json")
        cmd = [binary, "run", "--backend", "cpu", "--layers", str(LAYERS), "--width", str(WIDTH),
               "--batch", str(BATCH), "--activation", "relu", "--loss", "mse", "--steps",
               str(STEPS), "--engine", "fsdp2", "--emulate", f"{world}:{r}", "--json", path] + CONFIGS[config][0]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        out.append(json.load(open(path))["runs"][0]["ranks"][0])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worlds", default="2,3,4")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--torch-only", action="store_true", help="run torch alone")
    ap.add_argument("--json", help="write every figure here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    binary = os.environ.get("SHARDSCOPE", os.path.join(root, "build", "shardscope"))
    try:
        worlds = [int(w) for w in args.worlds.split(",")]
    except ValueError:
        sys.exit(f"torch_fsdp2: --worlds: expected a list of integers, got {args.worlds!r}")
    if any(w < 1 or w > 8 for w in worlds):
        sys.exit("torch_fsdp2: --worlds: each world must be 1 to 8")
    configs = args.configs.split(",")
    for c in configs:
        if c not in CONFIGS:
            sys.exit(f"torch_fsdp2: --configs: unknown {c!r}; known: {', '.join(CONFIGS)}")
    if not args.torch_only and not os.access(binary, os.X_OK):
        sys.exit(f"torch_fsdp2: no shardscope binary at {binary} (build it, set SHARDSCOPE, or --torch-only)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torch
    except ImportError:
        sys.exit(f"torch_fsdp2: PyTorch is not importable by {sys.executable}")

    print(f"torch {torch.__version__} (CPU, gloo) fully_shard beside "
          f"{'nothing (--torch-only)' if args.torch_only else binary}; model {LAYERS} x {WIDTH}, "
          f"ReLU after every layer, MSE, batch {BATCH}/rank, AdamW, step {STEPS}")
    records = []
    for config in configs:
        for world in worlds:
            with tempfile.TemporaryDirectory() as tmp:
                theirs = torch_ranks(config, world, tmp)
                ours = [] if args.torch_only else shardscope_ranks(binary, config, world, tmp)
            print(f"\n{config}, W = {world}   (--engine fsdp2 {' '.join(CONFIGS[config][0])})")
            print(f"  {'rank':>4}  {'torch rest':>11}  {'ours rest':>11}  {'torch peak':>11}  "
                  f"{'ours peak':>11}  phases (torch / ours)   torch's storages (param / grad / optim)")
            for r, t in enumerate(theirs):
                o = ours[r] if ours else None
                s = t["storages"]
                ours_rest = f"{o['resting']['total']:,}" if o else "-"
                ours_peak = f"{o['peak']['total']:,}" if o else "-"
                print(f"  {r:>4}  {t['resting']:>11,}  {ours_rest:>11}  "
                      f"{t['peak']:>11,}  {ours_peak:>11}  "
                      f"{t['phase']} / {o['peak']['phase'] if o else '-'}   "
                      f"{s['param']:,} / {s['grad']:,} / {s['optim']:,}")
                records.append({"config": config, "world": world, "rank": r, "torch": t,
                                "shardscope": {"resting": o["resting"], "peak": o["peak"]} if o else None})
    if args.json:
        tmp_path = args.json + ".tmp"
        with open(tmp_path, "w") as f:
            json.dump({"torch": torch.__version__, "records": records}, f, indent=1)
        os.replace(tmp_path, args.json)


if __name__ == "__main__":
    sys.exit(main())

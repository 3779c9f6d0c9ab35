#!/usr/bin/env python3
"""shardscope's resting and peak bytes beside PyTorch's, allocation by allocation.

PyTorch runs the model of docs/design.md §2 (L x (Linear(w, w) + ReLU), MSE against ones,
torch.optim.AdamW with its defaults) on CPU under gloo, one process per rank, wrapped
as each strategy's torch counterpart (docs/design.md §3). Two logs, from the model's
construction to the end of the third step, per rank:
  c10's CPU allocator, with FLAGS_caffe2_report_cpu_memory_usage set, logs every
  allocation and free on every thread with its running total; with marks written
  between the phases this gives
    resting  bytes live after step 3 (the batch and target of each step are freed),
    peak     the high-water mark during step 3 and its phase (forward, backward,
             optimizer);
  torch's profiler (profile_memory=True) logs the same events with address and op, but
  only on threads that carry its state; it itemizes the peak: bytes alive since before
  the step ("persistent") and each allocation made in the step, by the innermost op
  that made it. When the two logs disagree, the table says so.
shardscope runs the same configuration with `--emulate W:r` for every rank (memory is
exact when emulated, docs/design.md §5) and prints its peak by category. Both sides, and the
difference, are printed per configuration and rank.

Usage: bench/torch_peaks.py [--worlds 2,4] [--configs NAME,...] [--json FILE]
Environment: SHARDSCOPE  the binary (default build/shardscope)
Configurations (torch  <->  shardscope flags):
  ddp-view      DDP(gradient_as_bucket_view=True)            --strategy ddp
  ddp-copy      DDP()  (torch's default, a separate bucket)  --strategy ddp --ddp-bucket copy
  zero1         ZeroRedundancyOptimizer(AdamW) under DDP()   --strategy zero1 --ddp-bucket copy
  fsdp-root     FSDP, no wrap policy, SHARD_GRAD_OP          --strategy zero2 --units all
  zero2-unit    FSDP, each Linear wrapped, SHARD_GRAD_OP     --strategy zero2 --units 1
  zero3-unit    FSDP, each Linear wrapped, FULL_SHARD        --strategy zero3 --units 1
"""
import argparse
import bisect
import collections
import ctypes
import re
import json
import os
import socket
import subprocess
import sys
import tempfile
import warnings

LAYERS, WIDTH, BATCH, STEPS = 8, 256, 32, 3
MARK = "shardscope-mark"

CONFIGS = {
    "ddp-view": ["--strategy", "ddp"],
    "ddp-copy": ["--strategy", "ddp", "--ddp-bucket", "copy"],
    "zero1": ["--strategy", "zero1", "--ddp-bucket", "copy"],
    "fsdp-root": ["--strategy", "zero2", "--units", "all"],
    "zero2-unit": ["--strategy", "zero2", "--units", "1"],
    "zero3-unit": ["--strategy", "zero3", "--units", "1"],
}


# ---- one torch rank ---------------------------------------------------------------------

def build(config, torch):
    from torch.nn.parallel import DistributedDataParallel as DDP

    mods = []
    for _ in range(LAYERS):
        mods += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    model = torch.nn.Sequential(*mods)
    if config in ("ddp-view", "ddp-copy", "zero1"):
        model = DDP(model, gradient_as_bucket_view=(config == "ddp-view"))
        if config == "zero1":
            from torch.distributed.optim import ZeroRedundancyOptimizer
            return model, ZeroRedundancyOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    strategy = ShardingStrategy.FULL_SHARD if config == "zero3-unit" else ShardingStrategy.SHARD_GRAD_OP
    policy = None if config == "fsdp-root" else ModuleWrapPolicy({torch.nn.Linear})
    model = FSDP(model, sharding_strategy=strategy, auto_wrap_policy=policy,
                 device_id=torch.device("cpu"))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def itemize(trace_path):
    """Resting, peak, phase and live-at-peak from a chrome trace with memory events."""
    events = json.load(open(trace_path))["traceEvents"]
    ops = collections.defaultdict(list)  # tid -> [(ts, end, name)]
    marks = {}
    for e in events:
        if e.get("ph") != "X":
            continue
        if e.get("cat") == "user_annotation" and e["name"].startswith("ss:"):
            marks.setdefault(e["name"][3:], []).append((e["ts"], e["ts"] + e["dur"]))
        elif e.get("cat") == "cpu_op":
            ops[e["tid"]].append((e["ts"], e["ts"] + e["dur"], e["name"]))
    for spans in ops.values():
        spans.sort()
    starts = {tid: [s[0] for s in spans] for tid, spans in ops.items()}

    def op_at(tid, ts):
        spans = ops.get(tid, [])
        best = None
        for i in range(bisect.bisect_right(starts.get(tid, []), ts) - 1, -1, -1):
            s, end, name = spans[i]
            if s <= ts <= end and (best is None or end - s < best[1] - best[0]):
                best = (s, end, name)
            if ts - s > 10_000_000:  # ops do not last 10 s here
                break
        return best[2] if best else "(outside any op)"

    step_begin, step_end = marks["step"][-1]

    def enclosing_collective_end(tid, ts):
        ends = [end for s, end, name in ops.get(tid, []) if s <= ts <= end and name.startswith("c10d::")]
        return max(ends) if ends else None

    # (ts, order, bytes, addr, op); order keeps the profiler's order within one instant.
    memory = sorted(((e["ts"], e["args"]["Ev Idx"], e["args"]["Bytes"], e["args"]["Addr"], e["tid"])
                     for e in events if e.get("name") == "[memory]"
                     and e["args"].get("Device Type", 0) == 0), key=lambda m: (m[0], m[1]))
    # Some frees are never logged (seen: the copy of its input that gloo's reduce-scatter
    # makes inside c10d::_reduce_scatter_base_): its address is handed out again while the
    # log still holds it live, or it is still live when the log ends although nothing
    # holds it. A block made inside a c10d:: collective whose free is not logged is taken
    # as freed when that collective ends; any other block whose address is reused, just
    # before the reuse.
    synthetic = []
    open_blocks = {}
    for ts, order, nbytes, addr, tid in memory:
        if nbytes > 0:
            if addr in open_blocks:
                b_ts, b_bytes, b_tid = open_blocks[addr]
                end = enclosing_collective_end(b_tid, b_ts)
                free_ts = end if end is not None and end < ts else ts
                synthetic.append((free_ts, -1, -b_bytes, addr, b_tid))
            open_blocks[addr] = (ts, nbytes, tid)
        else:
            open_blocks.pop(addr, None)
    for addr, (b_ts, b_bytes, b_tid) in open_blocks.items():  # never freed in the log
        end = enclosing_collective_end(b_tid, b_ts)
        if end is not None:
            synthetic.append((end, -1, -b_bytes, addr, b_tid))
    stream = sorted(memory + synthetic, key=lambda m: (m[0], m[1]))

    live = {}  # addr -> (bytes, op, ts)
    total = peak = 0
    at_peak = None
    for ts, _, nbytes, addr, tid in stream:
        if nbytes > 0:
            live[addr] = (nbytes, op_at(tid, ts), ts)
            total += nbytes
        elif addr in live and live[addr][0] == -nbytes:
            del live[addr]
            total += nbytes
        if step_begin <= ts <= step_end and total > peak:
            peak, at_peak = total, (ts, dict(live))
    resting = sum(b for b, _, _ in live.values())
    ts, live_then = at_peak
    phase = next((name for name, spans in marks.items() if name != "step"
                  and any(s <= ts <= end for s, end in spans[-1:])), "?")
    persistent = sum(b for b, _, t in live_then.values() if t < step_begin)
    made = collections.Counter()
    for b, op, t in live_then.values():
        if t >= step_begin:
            made[(op, b)] += 1
    items = [{"op": op, "bytes": b, "count": n} for (op, b), n in
             sorted(made.items(), key=lambda kv: -kv[0][1] * kv[1])]
    return {"resting": resting, "peak": peak, "phase": phase, "persistent_at_peak": persistent,
            "made_in_step": items, "unlogged_frees": len(synthetic)}


def worker(args):
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=args.rank, world_size=args.world)
    torch.manual_seed(args.rank)
    # c10's CPU allocator logs every allocation and free, on every thread, with its
    # running total (to stderr, at TORCH_CPP_LOG_LEVEL=INFO): the complete count. The
    # profiler below sees only threads that carry its state; it is used to itemize.
    c10 = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
    ctypes.c_bool.in_dll(c10, "FLAGS_caffe2_report_cpu_memory_usage").value = True

    def mark(name):
        os.write(2, f"{MARK} {name}\n".encode())

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model, opt = build(args.config, torch)
        for _ in range(STEPS):
            with record_function("ss:step"):
                mark("step")
                x = torch.rand(BATCH, WIDTH) * 2 - 1
                target = torch.ones(BATCH, WIDTH)
                opt.zero_grad(set_to_none=False)
                with record_function("ss:forward"):
                    mark("forward")
                    loss = torch.nn.functional.mse_loss(model(x), target)
                with record_function("ss:backward"):
                    mark("backward")
                    loss.backward()
                with record_function("ss:optimizer"):
                    mark("optimizer")
                    opt.step()
                del x, target, loss
                mark("end")
    ctypes.c_bool.in_dll(c10, "FLAGS_caffe2_report_cpu_memory_usage").value = False
    trace = os.path.join(args.out, f"trace{args.rank}.json")
    prof.export_chrome_trace(trace)
    result = itemize(trace)
    os.remove(trace)
    with open(os.path.join(args.out, f"rank{args.rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


# ---- the driver ---------------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def allocator_figures(log_path):
    """Resting, peak and phase of the last step from c10's allocator log and our marks."""
    total = 0
    steps = []  # per step: {"peak", "phase"}; resting after the last "end"
    phase = None
    resting = None
    pattern = re.compile(r"C10 (?:alloc|deleted) \d+ bytes, total alloc (\d+) bytes")
    with open(log_path, errors="replace") as f:
        for line in f:
            if line.startswith(MARK):
                phase = line.split()[1]
                if phase == "step":
                    steps.append({"peak": total, "phase": "step"})
                elif phase == "end":
                    resting = total
                continue
            m = pattern.search(line)
            if not m:
                continue
            total = int(m.group(1))
            if steps and phase != "end" and total > steps[-1]["peak"]:
                steps[-1].update(peak=total, phase=phase)
    if len(steps) != STEPS or resting is None:
        raise RuntimeError(f"{log_path}: the allocator log lacks the step marks "
                           "(is TORCH_CPP_LOG_LEVEL=INFO honoured by this torch?)")
    return {"resting": resting, "peak": steps[-1]["peak"], "phase": steps[-1]["phase"]}


def torch_ranks(config, world, tmp):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
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
            tail = [l.strip() for l in open(logs[r], errors="replace") if "C10 " not in l][-1:]
            errors.append(f"rank {r}: exit {p.returncode}: {' '.join(tail)}")
    if errors:
        raise RuntimeError(f"torch {config} W={world}: " + "; ".join(errors))
    out = []
    for r in range(world):
        ranked = json.load(open(os.path.join(tmp, f"rank{r}.json")))
        ranked["profiler"] = {k: ranked.pop(k) for k in ("resting", "peak", "phase")}
        ranked.update(allocator_figures(logs[r]))
        out.append(ranked)
    return out


def shardscope_ranks(binary, config, world, tmp):
    out = []
    for r in range(world):
        path = os.path.join(tmp, f"ss{r}.json")
        cmd = [binary, "run", "--backend", "cpu", "--layers", str(LAYERS), "--width", str(WIDTH),
               "--batch", str(BATCH), "--activation", "relu", "--loss", "mse", "--steps",
               str(STEPS), "--emulate", f"{world}:{r}", "--json", path] + CONFIGS[config]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        rank = json.load(open(path))["runs"][0]["ranks"][0]
        out.append(rank)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--configs", default=",".join(CONFIGS))
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
        sys.exit(f"torch_peaks: --worlds: expected a list of integers, got {args.worlds!r}")
    if any(w < 1 or w > 8 for w in worlds):
        sys.exit("torch_peaks: --worlds: each world must be 1 to 8")
    configs = args.configs.split(",")
    for c in configs:
        if c not in CONFIGS:
            sys.exit(f"torch_peaks: --configs: unknown {c!r}; known: {', '.join(CONFIGS)}")
    if not os.access(binary, os.X_OK):
        sys.exit(f"torch_peaks: no shardscope binary at {binary} (build it, or set SHARDSCOPE)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torch
    except ImportError:
        sys.exit(f"torch_peaks: PyTorch is not importable by {sys.executable}")

    print(f"torch {torch.__version__} (CPU, gloo) beside {binary}; model {LAYERS} x {WIDTH}, "
          f"ReLU after every layer, MSE, batch {BATCH}/rank, AdamW, step {STEPS}")
    records = []
    for config in configs:
        for world in worlds:
            with tempfile.TemporaryDirectory() as tmp:
                theirs = torch_ranks(config, world, tmp)
                ours = shardscope_ranks(binary, config, world, tmp)
            print(f"\n{config}, W = {world}   ({' '.join(CONFIGS[config])})")
            print(f"  {'rank':>4}  {'torch rest':>11}  {'ours rest':>11}  {'torch peak':>11}  "
                  f"{'ours peak':>11}  {'torch - ours':>12}  phases (torch / ours)")
            for r, (t, o) in enumerate(zip(theirs, ours)):
                print(f"  {r:>4}  {t['resting']:>11,}  {o['resting']['total']:>11,}  {t['peak']:>11,}  "
                      f"{o['peak']['total']:>11,}  {t['peak'] - o['peak']['total']:>12,}  "
                      f"{t['phase']} / {o['peak']['phase']}, {o['peak']['where']}")
                records.append({"config": config, "world": world, "rank": r, "torch": t,
                                "shardscope": {"resting": o["resting"], "peak": o["peak"]}})
            t, o = theirs[0], ours[0]
            prof = t["profiler"]
            agree = prof["peak"] == t["peak"] and prof["resting"] == t["resting"]
            print(f"  rank 0 at its peak, from torch's profiler ("
                  + ("agrees with the allocator" if agree else
                     f"which misses some threads: rest {prof['resting']:,}, peak {prof['peak']:,}")
                  + (f"; {t['unlogged_frees']} unlogged frees placed as the module notes"
                     if t["unlogged_frees"] else "")
                  + f"): {t['persistent_at_peak']:,} B from before the step, and made in it:")
            for item in t["made_in_step"]:
                print(f"    {item['count']:>3} x {item['bytes']:>9,} B  {item['op']}")
            by_cat = {k: v for k, v in o["peak"]["by_category"].items() if k != "total"}
            above = {k: v - o["resting"].get(k, 0) for k, v in by_cat.items()}
            print("  shardscope at its peak, above rest by category: " +
                  ", ".join(f"{k} {v:,}" for k, v in above.items() if v))
    if args.json:
        tmp_path = args.json + ".tmp"
        with open(tmp_path, "w") as f:
            json.dump({"torch": torch.__version__, "records": records}, f, indent=1)
        os.replace(tmp_path, args.json)


if __name__ == "__main__":
    sys.exit(main())

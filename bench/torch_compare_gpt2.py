#!/usr/bin/env python3
"""shardscope's GPT-2 training step beside PyTorch eager's, both on one thread, alternated.

The model is nanoGPT's GPT as bench/torch_saved.py builds it (token and position
embeddings; blocks of LayerNorm, a fused QKV Linear, F.scaled_dot_product_attention
(is_causal=True), the output Linear, LayerNorm, Linear h -> 4h, GELU(approximate="tanh"),
Linear 4h -> h; ln_f; the head tied to wte; F.cross_entropy, mean over tokens), fp32,
with nanoGPT's init and torch.optim.AdamW at torch's defaults, on random token ids and
targets, a new batch each step; shardscope trains the same model (`run --model gpt2`).
--attention flash|math picks SDPA's backend (SDPBackend.FLASH_ATTENTION, torch's CPU
flash kernel, or SDPBackend.MATH) and shardscope's --attention; both (the default)
measures both.

Each round runs, per mode, shardscope (A) then torch (B): A B A B ..., so that a drift
in the machine's speed hits both sides. A side's run is --warmup untimed steps and
--steps timed ones:
  shardscope: `BINARY run --model gpt2 ... --backend cpu --steps WARMUP+STEPS --json f`
              in a child process; each step's wall time from the record's step_ms_all
              (past the warm-up). CPU time per step: the child's user + sys seconds less
              those of a run of WARMUP steps only (made in the same round), over STEPS.
  torch:      in this process (one model per mode, built once, kept across rounds);
              each step (zero_grad, forward, loss, backward, optimizer step) timed with
              time.perf_counter (wall) and time.process_time (CPU).
Both sides run with one thread (torch.set_num_threads(1); OPENBLAS_NUM_THREADS=1 and
OMP_NUM_THREADS=1 for the child) on the one CPU --cpu (sched_setaffinity, which the child
inherits). The CPU figure is the steadier on a loaded machine: a descheduled step's wall
time grows, its CPU time does not.

Prints a line per round and mode, then per mode: each side's min / median / max over
every timed step of every round (wall) and the median CPU ms per step; the ratio of the
medians (shardscope / torch), wall and CPU; the median (min-max) of the rounds' ratios.
Without --shardscope only torch is timed. Exit status 2 when torch cannot be imported
or the binary is missing; 3 when a shardscope run fails.
torch is a dependency of this script only (a bench), never of the build or its tests.
"""
import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings


def nanogpt_init(torch, model, layers):
    """nanoGPT's init: weights normal(0, 0.02), residual projections 0.02 / sqrt(2 L),
    biases 0, LayerNorms ones and zeros (shardscope's has the same standard deviations)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("c_proj.weight"):
                p.normal_(0.0, 0.02 / (2 * layers) ** 0.5)
            elif p.dim() == 2:
                p.normal_(0.0, 0.02)
            elif name.endswith("bias"):
                p.zero_()


class TorchSide:
    """One mode's torch model, optimizer and data, stepped `steps` at a time."""

    def __init__(self, torch, args, mode):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch_saved import build_gpt

        self.torch = torch
        self.sdpa = lambda: sdpa_kernel(SDPBackend.MATH if mode == "math" else SDPBackend.FLASH_ATTENTION)
        torch.manual_seed(args.seed)
        self.model = build_gpt(torch, args.layers, args.hidden, args.heads, args.vocab, args.seq)
        nanogpt_init(torch, self.model, args.layers)
        self.opt = torch.optim.AdamW(self.model.parameters())
        self.draw = lambda: (torch.randint(0, args.vocab, (args.batch, args.seq)),
                             torch.randint(0, args.vocab, (args.batch, args.seq)))
        self.loss = float("nan")

    def run(self, warmup, steps):
        """(wall ms per timed step, CPU ms per timed step)."""
        wall, cpu = [], []
        with self.sdpa():
            for s in range(warmup + steps):
                idx, targets = self.draw()  # a new batch each step, as shardscope draws
                c0, t0 = time.process_time(), time.perf_counter()
                self.opt.zero_grad()
                loss = self.model(idx, targets)
                loss.backward()
                self.opt.step()
                t1, c1 = time.perf_counter(), time.process_time()
                if s >= warmup:
                    wall.append((t1 - t0) * 1e3)
                    cpu.append((c1 - c0) * 1e3)
        self.loss = float(loss.item())
        return wall, cpu


def child_cpu_s():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def shardscope_run(binary, args, mode, steps, tmp):
    """(the record's step_ms_all, the child's CPU seconds) of one `run --model gpt2`."""
    out = os.path.join(tmp, "run.json")
    cmd = [binary, "run", "--model", "gpt2", "--layers", str(args.layers), "--hidden", str(args.hidden),
           "--heads", str(args.heads), "--vocab", str(args.vocab), "--seq", str(args.seq),
           "--batch", str(args.batch), "--attention", mode, "--steps", str(steps), "--seed", str(args.seed),
           "--backend", "cpu", "--json", out]
    before = child_cpu_s()
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    cpu = child_cpu_s() - before
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr.strip()}")
    with open(out) as f:
        return json.load(f)["runs"][0]["ranks"][0]["step_ms_all"], cpu


def spread(xs):
    return f"{min(xs):7.2f} / {statistics.median(xs):7.2f} / {max(xs):7.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4, help="sequences (default 4)")
    ap.add_argument("--attention", choices=["math", "flash", "both"], default="both")
    ap.add_argument("--rounds", type=int, default=10, help="A B rounds per mode (default 10)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per run (default 10)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cpu", type=int, default=0, help="the CPU both sides run on (default 0; -1: no pin)")
    ap.add_argument("--shardscope", metavar="BINARY", help="the shardscope binary (without it, torch alone)")
    args = ap.parse_args()
    if args.rounds < 1 or args.steps < 1 or args.warmup < 1:
        print("torch_compare_gpt2.py: error: --rounds, --steps and --warmup must be >= 1", file=sys.stderr)
        return 2
    if args.shardscope and not os.access(args.shardscope, os.X_OK):
        print(f"torch_compare_gpt2.py: error: --shardscope {args.shardscope} is not an executable",
              file=sys.stderr)
        return 2

    # One thread for every BLAS and OpenMP runtime either side loads; the child inherits them.
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = "1"
    if args.cpu >= 0:
        os.sched_setaffinity(0, {args.cpu})
    warnings.filterwarnings("ignore")  # e.g. "Failed to initialize NumPy" when numpy is absent
    try:
        import torch
    except ImportError as e:
        print(f"torch_compare_gpt2.py: PyTorch is not installed ({e}); install it with: "
              "pip install torch --index-url https://download.pytorch.org/whl/cpu (or pip install torch)",
              file=sys.stderr)
        return 2
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    torch.set_num_threads(1)

    modes = ["flash", "math"] if args.attention == "both" else [args.attention]
    torch_sides = {m: TorchSide(torch, args, m) for m in modes}
    shape = (f"gpt2 --layers {args.layers} --hidden {args.hidden} --heads {args.heads} --vocab {args.vocab} "
             f"--seq {args.seq} --batch {args.batch}")
    print(f"torch_compare_gpt2: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"pinned to {args.cpu if args.cpu >= 0 else 'none'}; torch {torch.__version__} "
          f"(capability {torch.backends.cpu.get_cpu_capability()}); "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}; load {os.getloadavg()[0]:.1f}")
    print(f"{shape}; {args.rounds} rounds of {args.steps} timed steps after {args.warmup} warm-up, each side")
    print()
    print(f"{'mode':6} {'round':>5} {'shardscope ms':>14} {'cpu ms':>8} {'torch ms':>9} {'cpu ms':>8} {'ratio':>6}")

    ss_wall = {m: [] for m in modes}
    ss_cpu = {m: [] for m in modes}
    pt_wall = {m: [] for m in modes}
    pt_cpu = {m: [] for m in modes}
    ratios = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(1, args.rounds + 1):
            for mode in modes:
                ss_med = ss_step_cpu = float("nan")
                if args.shardscope:
                    try:
                        _, base_cpu = shardscope_run(args.shardscope, args, mode, args.warmup, tmp)
                        all_ms, cpu = shardscope_run(args.shardscope, args, mode, args.warmup + args.steps, tmp)
                    except RuntimeError as e:
                        print(f"torch_compare_gpt2.py: {e}", file=sys.stderr)
                        return 3
                    timed = all_ms[args.warmup:]
                    ss_wall[mode] += timed
                    ss_step_cpu = (cpu - base_cpu) * 1e3 / args.steps
                    ss_cpu[mode].append(ss_step_cpu)
                    ss_med = statistics.median(timed)
                wall, cpu = torch_sides[mode].run(args.warmup, args.steps)
                pt_wall[mode] += wall
                pt_cpu[mode] += cpu
                pt_med = statistics.median(wall)
                ratio = ss_med / pt_med
                ratios[mode].append(ratio)
                print(f"{mode:6} {r:5d} {ss_med:14.2f} {ss_step_cpu:8.2f} {pt_med:9.2f} "
                      f"{statistics.median(cpu):8.2f} {ratio:6.3f}", flush=True)

    print()
    print(f"{'mode':6} {'side':10} {'wall ms min / median / max':>28} {'cpu ms median':>14}")
    for mode in modes:
        if args.shardscope:
            print(f"{mode:6} {'shardscope':10} {spread(ss_wall[mode]):>28} {statistics.median(ss_cpu[mode]):14.2f}")
        print(f"{mode:6} {'torch':10} {spread(pt_wall[mode]):>28} {statistics.median(pt_cpu[mode]):14.2f}")
    if args.shardscope:
        print()
        for mode in modes:
            wall = statistics.median(ss_wall[mode]) / statistics.median(pt_wall[mode])
            cpu = statistics.median(ss_cpu[mode]) / statistics.median(pt_cpu[mode])
            rs = ratios[mode]
            print(f"{mode}: shardscope / torch, ratio of medians: wall {wall:.3f}, cpu {cpu:.3f}; "
                  f"rounds' wall ratio {statistics.median(rs):.3f} ({min(rs):.3f}-{max(rs):.3f})")
    print(f"torch's last losses: " + ", ".join(f"{m} {torch_sides[m].loss:.4f}" for m in modes))
    return 0


if __name__ == "__main__":
    sys.exit(main())

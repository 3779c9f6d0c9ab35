#!/usr/bin/env python3
"""The GPU check's table (run by scripts/gpu-check.sh on the lent GPU machine).

1. The seed's data-parallel configurations on cuda, real at W = 1 and emulated
   (--emulate W:r, every rank) at W = 2 and 4, beside the same runs on the cpu backend:
   resting bytes per category (identical but for cuBLAS's 32 MiB workspace, category
   workspace, which cuda holds and cpu does not), peaks, the pool's UsedMemCurrent /
   UsedMemHigh beside the tracker's figures, and the bytes outside the pool.
2. Step time of a larger model (8 x 4096, batch 64, ReLU, MSE) per strategy on cuda at
   W = 1, beside PyTorch eager on the same card (bench/torch_mlp.py).
Every check that fails is listed under "Problems" at the end of OUT_DIR/gpu-table.md
(written even when the script itself breaks), and the exit status is 1; 0 means every
comparison held.
Usage: gpu_table.py BUILD_DIR OUT_DIR
"""
import atexit
import concurrent.futures as cf
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback

build, out = sys.argv[1], sys.argv[2]
exe = os.path.join(build, "shardscope")
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
runs_dir = tempfile.mkdtemp(prefix="gpu-table-")  # run JSONs stay out of OUT_DIR
lines = []
problems = []


def say(s=""):
    print(s, flush=True)
    lines.append(s)


def problem(what):
    problems.append(what)


def write_table():
    body = lines + ["", "## Problems", ""] + ([f"- {p}" for p in problems] or ["none: every comparison held"])
    with open(os.path.join(out, "gpu-table.md"), "w") as f:
        f.write("\n".join(body) + "\n")
    subprocess.run(["rm", "-rf", runs_dir])


def record_crash(kind, value, tb):
    problem("gpu_table.py broke: " + "".join(traceback.format_exception_only(kind, value)).strip())
    sys.__excepthook__(kind, value, tb)


atexit.register(write_table)
sys.excepthook = record_crash


def stopped(signum, _frame):
    problem(f"gpu_table.py was stopped by signal {signum} (its time limit): later checks did not run")
    write_table()  # the table so far
    os._exit(1)  # at once: worker threads may still be waiting on their runs


signal.signal(signal.SIGTERM, stopped)
# gpu-check.sh gives a deadline; every run's own timeout is cut to the time left.
deadline = time.monotonic() + float(os.environ.get("GPU_TABLE_DEADLINE", "100000"))


def time_left(want):
    return max(1, min(want, int(deadline - time.monotonic())))


def run(args, tag, launcher=(), env=None, timeout=240):
    """One `shardscope run` (under `launcher`, e.g. mpirun -np 2): its run, or {"error": ...}."""
    path = os.path.join(runs_dir, tag + ".json")
    timeout = time_left(timeout)
    if deadline - time.monotonic() < 1:
        return {"error": "not run: the time limit was spent"}
    try:
        p = subprocess.run([*launcher, exe, "run", *args, "--json", path], capture_output=True, text=True,
                           timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    if p.returncode != 0:
        errors = [l for l in p.stderr.splitlines() if "shardscope: error" in l] or p.stderr.strip().splitlines()
        return {"error": "exit %d: %s" % (p.returncode, (errors or [""])[0])}
    return json.load(open(path))["runs"][0]


def fmt(v):
    return f"{v:,}" if isinstance(v, int) else "-" if v is None else str(v)


SEED = ["--layers", "8", "--width", "256", "--batch", "32", "--activation", "none", "--loss", "sum", "--steps", "3"]

# Without a usable GPU every cuda row would fail alike: say it once and stop.
probe = run(SEED + ["--backend", "cuda"], "probe")
if "error" in probe:
    say(f"cuda probe (`shardscope run --backend cuda`, seed model): {probe['error']}")
    problem(f"cuda does not run here: {probe['error']}")
    sys.exit(1)
CONFIGS = [("ddp", []), ("zero1", []), ("zero2", ["--units", "all"]), ("zero2", ["--units", "1"]),
           ("zero3", ["--units", "all"]), ("zero3", ["--units", "1"])]

jobs = []
for strat, extra in CONFIGS:
    for world in (1, 2, 4):
        if world == 1 and strat not in ("ddp",):
            continue
        for rank in range(world):
            em = [] if world == 1 else ["--emulate", f"{world}:{rank}"]
            for backend in ("cuda", "cpu"):
                args = SEED + ["--strategy", strat, *extra, "--backend", backend, *em]
                tag = f"{strat}{''.join(extra).replace('--units', '-u')}-w{world}-r{rank}-{backend}"
                jobs.append(((strat, " ".join(extra) or "-", world, rank, backend), args, tag))

def check_predicted(record, label):
    """A cuda rank or stage against the closed forms: resting, peak, and the peak per category."""
    pred = record.get("predicted", {})
    measured = (record["resting"]["total"], record["peak"]["total"], record["peak"].get("by_category"))
    predicted = (pred.get("resting_total"), pred.get("peak_total"), pred.get("peak_by_category"))
    if measured != predicted:
        problem(f"{label}: measured resting / peak {measured[0]:,} / {measured[1]:,} (by category "
                f"{measured[2]}) differ from the predicted {predicted[0]} / {predicted[1]} ({predicted[2]})")


def pair_failed(c, p, row, label, cells):
    """Says so (a table row starting with `row`, `cells` empty cells after the two errors, and a
    problem naming `label`) when the cuda or the cpu run of a pair failed."""
    if "error" not in c and "error" not in p:
        return False
    say(f"| {row} | {c.get('error', '')} | {p.get('error', '')} |" + " |" * cells)
    problem(f"{label}: cuda {c.get('error', 'ok')}; cpu {p.get('error', 'ok')}")
    return True


def run_all(job_list, into):
    """Every (key, args, tag) of job_list, six at a time; results into `into` by key."""
    with cf.ThreadPoolExecutor(max_workers=6) as pool:
        futs = {pool.submit(run, a, t): k for k, a, t in job_list}
        for f in cf.as_completed(futs):
            into[futs[f]] = f.result()


results = {}
run_all(jobs, results)

WORKSPACE = 32 << 20  # cuBLAS's workspace (kCudaWorkspaceBytes), category workspace, cuda only


def less_workspace(figures):
    """A cuda category object with its workspace (exactly WORKSPACE, else a problem) taken
    out: then it must equal cpu's, which has none."""
    f = dict(figures)
    if f.get("workspace") != WORKSPACE:
        problem(f"cuda workspace is {f.get('workspace')!r}, not {WORKSPACE:,}")
    f["workspace"] = 0
    f["total"] = f["total"] - WORKSPACE
    return f


def same_as_cpu(cuda_rank, cpu_rank):
    """cuda's resting bytes per category and peak equal cpu's plus the workspace."""
    return (less_workspace(cuda_rank["resting"]) == cpu_rank["resting"]
            and cuda_rank["peak"]["total"] == cpu_rank["peak"]["total"] + WORKSPACE
            and cuda_rank["peak"]["by_category"].get("workspace") == WORKSPACE)

say("## Seed configurations: cuda beside cpu (bytes per rank)")
say("")
say(f"cuda holds cuBLAS's workspace ({WORKSPACE:,} B, category workspace) at rest and at the peak; "
    "\"same\" means cuda's bytes are cpu's plus exactly that.")
say("")
say("| strategy | units | W | rank | cuda resting | cpu resting | same per category | cuda peak | cpu peak | pool used_current | tracker rounded resting | pool used_high | tracker rounded peak | outside pool |")
say("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
all_same = True
for (strat, units, world, rank, backend), _, _ in jobs:
    if backend != "cuda":
        continue
    c = results[(strat, units, world, rank, "cuda")]
    p = results[(strat, units, world, rank, "cpu")]
    label = f"{strat} units {units} W={world} rank {rank}"
    if pair_failed(c, p, f"{strat} | {units} | {world} | {rank}", label, 8):
        all_same = False
        continue
    cr, pr = c["ranks"][0], p["ranks"][0]
    same = same_as_cpu(cr, pr)
    same_peak = same
    all_same &= same
    if not (same and same_peak):
        problem(f"{label}: cuda bytes differ from cpu (resting {cr['resting']['total']:,} vs "
                f"{pr['resting']['total']:,}, peak {cr['peak']['total']:,} vs {pr['peak']['total']:,})")
    check_predicted(cr, label)
    pool = cr.get("pool") or {}
    if pool.get("used_current") != cr["rounded"]["resting_total"] or pool.get("used_high") != cr["rounded"]["peak_total"]:
        problem(f"{label}: pool {fmt(pool.get('used_current'))} / {fmt(pool.get('used_high'))} against tracker "
                f"{cr['rounded']['resting_total']:,} / {cr['rounded']['peak_total']:,}")
    if not isinstance(cr.get("outside_pool_bytes"), int) or cr["outside_pool_bytes"] <= 0:
        problem(f"{label}: outside_pool_bytes is {cr.get('outside_pool_bytes')!r}")
    say(f"| {strat} | {units} | {world} | {rank} | {cr['resting']['total']:,} | {pr['resting']['total']:,} | "
        f"{'yes' if same else 'NO'} | {cr['peak']['total']:,} | {pr['peak']['total']:,} | "
        f"{fmt(pool.get('used_current'))} | {cr['rounded']['resting_total']:,} | {fmt(pool.get('used_high'))} | "
        f"{cr['rounded']['peak_total']:,} | {fmt(cr.get('outside_pool_bytes'))} |")
say("")
say(f"cuda resting and peak bytes identical to cpu's plus the workspace for every rank: {'yes' if all_same else 'NO'}")
say("")

# NCCL through the command line at one rank (no MPI needed): bytes as cpu's, comm named.
nccl1 = run(SEED + ["--strategy", "zero3", "--units", "1", "--backend", "cuda", "--comm", "nccl"], "nccl-w1")
cpu1 = run(SEED + ["--strategy", "zero3", "--units", "1", "--backend", "cpu"], "cpu-w1-zero3")
if "error" in nccl1 or "error" in cpu1:
    say(f"NCCL at one rank (zero3 --units 1): cuda {nccl1.get('error', 'ok')}; cpu {cpu1.get('error', 'ok')}")
    problem(f"NCCL at one rank: cuda {nccl1.get('error', 'ok')}; cpu {cpu1.get('error', 'ok')}")
else:
    n, c = nccl1["ranks"][0], cpu1["ranks"][0]
    same = same_as_cpu(n, c) and nccl1["comm"] == "nccl"
    say(f"NCCL at one rank (zero3 --units 1, comm {nccl1['comm']}): resting {n['resting']['total']:,} / "
        f"{c['resting']['total']:,} on cpu, peak {n['peak']['total']:,} / {c['peak']['total']:,}: "
        f"{'same' if same else 'DIFFERENT'}")
    if not same:
        problem("NCCL at one rank: bytes differ from cpu, or the run did not use nccl")
say("")

# The seed's pipelines, every stage emulated, cuda beside cpu: saved tensors and bytes.
PP = ["--layers", "2", "--width", "32", "--batch", "8", "--activation", "relu", "--loss", "mse", "--steps", "2"]
pp_jobs = []
for sched in ("gpipe", "1f1b", "zb-h1"):
    for m in (2, 4, 8):
        for stage in range(2):
            for backend in ("cuda", "cpu"):
                args = PP + ["--schedule", sched, "--microbatches", str(m), "--backend", backend,
                             "--emulate", f"2:{stage}"]
                pp_jobs.append(((sched, m, stage, backend), args, f"pp-{sched}-m{m}-s{stage}-{backend}"))
run_all(pp_jobs, results)
say("## Seed pipelines (S = 2, emulated stages): cuda beside cpu")
say("")
say("| schedule | M | stage | saved peak live (cuda / cpu) | live bytes (cuda / cpu) | resting (cuda / cpu) | peak (cuda / cpu) |")
say("|---|---|---|---|---|---|---|")
pp_same = True
for (sched, m, stage, backend), _, _ in pp_jobs:
    if backend != "cuda":
        continue
    c, p = results[(sched, m, stage, "cuda")], results[(sched, m, stage, "cpu")]
    if pair_failed(c, p, f"{sched} | {m} | {stage}", f"pipeline {sched} M={m} stage {stage}", 2):
        pp_same = False
        continue
    cs, ps = c["stages"][0], p["stages"][0]
    same = cs["saved"] == ps["saved"] and same_as_cpu(cs, ps)
    pp_same &= same
    if not same:
        problem(f"pipeline {sched} M={m} stage {stage}: cuda saved/resting/peak differ from cpu")
    check_predicted(cs, f"pipeline {sched} M={m} stage {stage}")
    say(f"| {sched} | {m} | {stage} | {cs['saved']['peak_live_tensors']} / {ps['saved']['peak_live_tensors']} | "
        f"{cs['saved']['peak_live_bytes']:,} / {ps['saved']['peak_live_bytes']:,} | "
        f"{cs['resting']['total']:,} / {ps['resting']['total']:,} | {cs['peak']['total']:,} / {ps['peak']['total']:,} |")
say("")
say(f"pipeline stages identical on cuda and cpu (cuda plus its workspace): {'yes' if pp_same else 'NO'}")
say("")

# Two ranks sharing the one GPU over --comm mpi (pinned staging), beside the cpu
# backend: bytes per rank and the losses (training is real on both); and NCCL's refusal
# of more ranks than GPUs.
mpirun = subprocess.run(["bash", "-c", "command -v mpirun"], capture_output=True, text=True).stdout.strip()
if mpirun:
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")

    def mpi_run(args, tag):
        return run(args, tag, launcher=(mpirun, "-np", "2", "--oversubscribe"), env=env)

    say("## Two ranks on one GPU (--comm mpi, pinned staging) beside cpu, W = 2")
    say("")
    say("| run | rank | cuda resting / peak | cpu resting / peak | same | loss cuda / cpu (last step) |")
    say("|---|---|---|---|---|---|")
    for name, args in (("ddp", ["--strategy", "ddp"]), ("zero1", ["--strategy", "zero1"]),
                       ("zero2 units 1", ["--strategy", "zero2", "--units", "1"]),
                       ("zero3 units 1", ["--strategy", "zero3", "--units", "1"]),
                       ("1f1b M=4", ["--schedule", "1f1b", "--microbatches", "4", "--layers", "4",
                                     "--activation", "relu", "--loss", "mse"])):
        base = SEED[:-2] + ["--steps", "3"] if "--schedule" not in args else \
            ["--width", "256", "--batch", "32", "--steps", "3"]
        c = mpi_run(base + args + ["--backend", "cuda", "--comm", "mpi"], "mpi-cuda-" + name.replace(" ", ""))
        p = mpi_run(base + args + ["--backend", "cpu", "--comm", "mpi"], "mpi-cpu-" + name.replace(" ", ""))
        if "error" in c or "error" in p:
            say(f"| {name} | - | {c.get('error', '')} | {p.get('error', '')} | NO | |")
            problem(f"--comm mpi {name}: cuda {c.get('error', 'ok')}; cpu {p.get('error', 'ok')}")
            continue
        key = "stages" if "stages" in c else "ranks"
        for cr, pr in zip(c[key], p[key]):
            same = cr["resting"] == pr["resting"] and cr["peak"]["total"] == pr["peak"]["total"]
            cl = (cr.get("loss") or [None])[-1]
            pl = (pr.get("loss") or [None])[-1]
            who = f"--comm mpi {name} rank {cr.get('rank', cr.get('stage'))}"
            if not same:
                problem(f"{who}: cuda bytes differ from cpu")
            # Same data, same math; the GPU's fused multiply-adds move the last bits.
            if cl is not None and pl is not None and abs(cl - pl) > 1e-4 * max(1.0, abs(pl)):
                problem(f"{who}: loss {cl} on cuda against {pl} on cpu")
            say(f"| {name} | {cr.get('rank', cr.get('stage'))} | {cr['resting']['total']:,} / {cr['peak']['total']:,} | "
                f"{pr['resting']['total']:,} / {pr['peak']['total']:,} | {'yes' if same else 'NO'} | {cl} / {pl} |")
    try:
        r = subprocess.run([mpirun, "-np", "2", "--oversubscribe", exe, "run", "--backend", "cuda", "--comm", "nccl"],
                           capture_output=True, text=True, timeout=time_left(120), env=env)
        err = [l for l in r.stderr.splitlines() if "shardscope: error" in l]
        code, text = r.returncode, (err[0] if err else r.stderr.strip()[-200:])
    except subprocess.TimeoutExpired:
        code, text = None, "timed out after 120 s"
    say("")
    say(f"NCCL with 2 ranks on 1 GPU: exit {code}: {text}")
    if code != 2 or "one GPU per rank" not in text:
        problem(f"NCCL with 2 ranks on 1 GPU: expected exit 2 naming 'one GPU per rank', got exit {code}: {text}")
    say("")
else:
    say("multi-rank checks: NOT RUN (no mpirun on this machine): `--comm mpi` with two ranks "
        "sharing the GPU and NCCL's refusal were not exercised")
    say("")

BIG = ["--layers", "8", "--width", "4096", "--batch", "64", "--activation", "relu", "--loss", "mse", "--steps", "21",
       "--backend", "cuda"]
say("## Step time, 8 x 4096, batch 64, ReLU, MSE, fp32 (TF32 off), W = 1, median of 20 steps after warm-up")
say("")
say("| run | step ms (median) | step ms (min) | resting B | peak B |")
say("|---|---|---|---|---|")
for strat, extra in CONFIGS:
    r = run(BIG + ["--strategy", strat, *extra], f"big-{strat}{''.join(extra)}")
    if "error" in r:
        say(f"| shardscope {strat} {' '.join(extra)} | {r['error']} | | | |")
        problem(f"8 x 4096 {strat} {' '.join(extra)}: {r['error']}")
        continue
    k = r["ranks"][0]
    say(f"| shardscope {strat} {' '.join(extra)} | {k['step_ms']['median']:.3f} | {k['step_ms']['min']:.3f} | "
        f"{k['resting']['total']:,} | {k['peak']['total']:,} |")
    check_predicted(k, f"8 x 4096 {strat} {' '.join(extra)}")  # a 2 GB model, to the byte
try:
    t = subprocess.run([sys.executable, os.path.join(root, "bench", "torch_mlp.py"), "--device", "cuda", "--layers",
                        "8", "--width", "4096", "--batch", "64", "--steps", "21"], capture_output=True, text=True,
                       timeout=time_left(180))
    torch_text = t.stdout.strip() or " ".join(t.stderr.strip().splitlines()[-1:]) or f"exit {t.returncode}"
except subprocess.TimeoutExpired:
    torch_text = "timed out after 180 s"
say(f"| torch eager (same model, AdamW; median min) | {torch_text} | | | |")
sys.exit(1 if problems else 0)

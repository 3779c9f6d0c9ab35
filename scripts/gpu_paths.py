#!/usr/bin/env python3
"""The GPU check's second table (run by scripts/gpu-check.sh after scripts/gpu_table.py):
the paths beyond the seed's configurations, appended to OUT_DIR/gpu-table.md.

1. The whole device: each cuda run's memory outside the pool and its parts (the CUDA
   context, cuBLAS, NCCL per communicator, the rest: outside_pool_parts), for one rank on
   NCCL (ddp and zero3 --units 1) and one on the self communicator; every part must be
   measured (or, without NVML, say so), NCCL must have a communicator, and the parts must
   not exceed the whole.
2. Overlap (`--overlap on|off`, when the binary knows the flag): ddp and zero3 --units 1 on
   NCCL with overlap on and off: bytes measured == predicted in both, the same bytes either
   way, and every collective's exposed_ms <= its ms (when the records carry exposed_ms).
3. Transformers: gpt2 and llama (small shapes) with --backend cuda, real at W = 1 and
   emulated at W = 2, beside the cpu backend: bytes equal but for cuBLAS's workspace, and
   measured == predicted.
4. bf16 (`--precision bf16`, when the binary runs it): ddp and zero3 on the MLP and on gpt2,
   cuda beside cpu, measured == predicted.
A flag the binary does not know is reported as not run (not as a problem). Every check that
fails is listed under "Problems (GPU paths)"; exit status 1 then, 0 when every check held.
Runs are cut to GPU_TABLE_DEADLINE seconds in all (default: no limit).

Usage: gpu_paths.py BUILD_DIR OUT_DIR
"""
import atexit
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

build, out = sys.argv[1], sys.argv[2]
exe = os.path.join(build, "shardscope")
runs_dir = tempfile.mkdtemp(prefix="gpu-paths-")
lines = ["", "# GPU paths: whole device, overlap, transformers, bf16", ""]
problems = []
WORKSPACE = 32 << 20  # cuBLAS's workspace (kCudaWorkspaceBytes), category workspace, cuda only
deadline = time.monotonic() + float(os.environ.get("GPU_TABLE_DEADLINE", "100000"))


def say(s=""):
    print(s, flush=True)
    lines.append(s)


def problem(what):
    problems.append(what)


def write_table():
    """Appends this table to gpu-table.md (gpu_table.py wrote the first part)."""
    body = lines + ["", "## Problems (GPU paths)", ""] + ([f"- {p}" for p in problems] or ["none: every check held"])
    with open(os.path.join(out, "gpu-table.md"), "a") as f:
        f.write("\n".join(body) + "\n")
    subprocess.run(["rm", "-rf", runs_dir])


atexit.register(write_table)


def stopped(signum, _frame):
    problem(f"gpu_paths.py was stopped by signal {signum} (its time limit): later checks did not run")
    write_table()
    os._exit(1)


signal.signal(signal.SIGTERM, stopped)


def run(args, tag, timeout=120):
    """One `shardscope run`: its first run record, or {"error": ...}."""
    path = os.path.join(runs_dir, tag + ".json")
    timeout = max(1, min(timeout, int(deadline - time.monotonic())))
    if deadline - time.monotonic() < 1:
        return {"error": "not run: the time limit was spent"}
    try:
        p = subprocess.run([exe, "run", *args, "--json", path], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    if p.returncode != 0:
        errors = [l for l in p.stderr.splitlines() if "shardscope: error" in l] or p.stderr.strip().splitlines()
        return {"error": "exit %d: %s" % (p.returncode, (errors or [""])[0])}
    return json.load(open(path))["runs"][0]


def knows(flag):
    """Whether `shardscope run` lists `flag` in its help."""
    p = subprocess.run([exe, "run", "--help"], capture_output=True, text=True)
    return flag in p.stdout


def accepts(args):
    """Whether a tiny cpu run with `args` is accepted (a flag can be known and its value not
    built yet: `--precision bf16` before its regime landed)."""
    p = subprocess.run([exe, "run", "--backend", "cpu", "--layers", "1", "--width", "8", "--batch", "2", "--steps", "1",
                        *args], capture_output=True, text=True)
    return p.returncode == 0, (p.stderr.strip().splitlines() or [""])[0]


def fmt(v):
    if isinstance(v, float):
        return f"{v:.3f}"
    return f"{v:,}" if isinstance(v, int) else "-" if v is None else str(v)


def members(record):
    return record.get("ranks", []) + record.get("stages", [])


def check_predicted(record, label):
    for m in members(record):
        pred = m.get("predicted", {})
        got = (m["resting"]["total"], m["peak"]["total"])
        want = (pred.get("resting_total"), pred.get("peak_total"))
        if got != want:
            problem(f"{label}: measured resting / peak {got[0]:,} / {got[1]:,} differ from the predicted {want}")


def same_bytes_as_cpu(cuda, cpu, label):
    """cuda's resting and peak totals per member are cpu's plus the workspace."""
    for c, p in zip(members(cuda), members(cpu)):
        if (c["resting"]["total"] - WORKSPACE, c["peak"]["total"] - WORKSPACE) != (p["resting"]["total"], p["peak"]["total"]):
            problem(f"{label}: cuda resting / peak {c['resting']['total']:,} / {c['peak']['total']:,} are not cpu's "
                    f"{p['resting']['total']:,} / {p['peak']['total']:,} plus the workspace {WORKSPACE:,}")
            return False
    return True


SMALL = ["--layers", "4", "--width", "256", "--batch", "16", "--steps", "3"]
GPT2 = ["--model", "gpt2", "--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "256", "--seq", "32",
        "--positions", "64", "--batch", "2", "--steps", "3"]
LLAMA = ["--model", "llama", "--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--ffn", "128",
         "--vocab", "256", "--seq", "32", "--positions", "64", "--batch", "2", "--steps", "3"]

# ---- 1. the whole device ------------------------------------------------------------------
say("## The whole device: memory outside the pool, part by part (one rank)")
say("")
say("Each part is the growth of the process's device memory around its making (NVML's figure for "
    "the process, else cudaMemGetInfo's): the CUDA context at cudaSetDevice, cuBLAS's handle with its "
    "stream and our workspace (the pool's growth taken off), each NCCL communicator at ncclCommInitRank "
    "and at the first call of each kind (NCCL connects lazily); other: the rest.")
say("")
say("| run | outside pool | source | CUDA context | cuBLAS | NCCL communicators (init -> after first calls) | other |")
say("|---|---|---|---|---|---|---|")
for label, args in [("ddp, nccl", SMALL + ["--strategy", "ddp", "--comm", "nccl"]),
                    ("zero3 --units 1, nccl", SMALL + ["--strategy", "zero3", "--units", "1", "--comm", "nccl"]),
                    ("ddp, self", SMALL + ["--strategy", "ddp", "--comm", "self"]),
                    ("gpt2 zero3, nccl", GPT2 + ["--strategy", "zero3", "--comm", "nccl"])]:
    r = run(args + ["--backend", "cuda"], "device-" + label.replace(" ", "_").replace(",", ""))
    if "error" in r:
        say(f"| {label} | {r['error']} | | | | | |")
        problem(f"whole device, {label}: {r['error']}")
        continue
    m = r["ranks"][0]
    parts = m.get("outside_pool_parts")
    if not isinstance(parts, dict):
        say(f"| {label} | {fmt(m.get('outside_pool_bytes'))} | {fmt(m.get('outside_pool_source'))} | no parts recorded | | | |")
        problem(f"whole device, {label}: the record has no outside_pool_parts")
        continue
    nccl = "; ".join(f"{c['communicator']} ({c['ranks']}): {fmt(c['init_bytes'])} -> {fmt(c['bytes'])} ({c['source']})"
                     for c in parts["nccl"]) or "none"
    say(f"| {label} | {fmt(m.get('outside_pool_bytes'))} | {fmt(m.get('outside_pool_source'))} | "
        f"{fmt(parts['cuda_context']['bytes'])} ({parts['cuda_context']['source']}) | "
        f"{fmt(parts['cublas']['bytes'])} ({parts['cublas']['source']}) | {nccl} | {fmt(parts['other'])} |")
    if parts["cublas"]["bytes"] is None:
        problem(f"whole device, {label}: cuBLAS's part was not measured")
    if m.get("outside_pool_source") == "nvml" and parts["cuda_context"]["bytes"] is None:
        problem(f"whole device, {label}: NVML gives the figure but the context was not measured")
    wants_nccl = "nccl" in label
    if wants_nccl != bool(parts["nccl"]):
        problem(f"whole device, {label}: {len(parts['nccl'])} NCCL communicators recorded")
    for c in parts["nccl"]:
        if c["bytes"] is None or c["init_bytes"] is None or c["bytes"] < c["init_bytes"]:
            problem(f"whole device, {label}: NCCL communicator {c['communicator']}: init {c['init_bytes']}, "
                    f"after first calls {c['bytes']}")
    if isinstance(m.get("outside_pool_bytes"), int) and parts["other"] is None:
        problem(f"whole device, {label}: the parts exceed the whole, or one of them was not measured (other is null)")
say("")

# ---- 2. overlap on and off ------------------------------------------------------------------
say("## Overlap on and off (NCCL, one rank)")
say("")
if not knows("--overlap"):
    say("not run: this binary has no --overlap flag (the overlap work has not landed)")
else:
    say("| run | overlap | resting | peak | measured == predicted | comm ms | exposed ms | exposed <= ms | step ms (median) |")
    say("|---|---|---|---|---|---|---|---|---|")
    for label, args in [("ddp", SMALL + ["--strategy", "ddp"]), ("zero3 --units 1", SMALL + ["--strategy", "zero3", "--units", "1"])]:
        seen = {}
        for mode in ("on", "off"):
            r = run(args + ["--backend", "cuda", "--comm", "nccl", "--overlap", mode], f"overlap-{label[:5]}-{mode}")
            if "error" in r:
                say(f"| {label} | {mode} | {r['error']} | | | | | | |")
                problem(f"overlap {mode}, {label}: {r['error']}")
                continue
            m = r["ranks"][0]
            check_predicted(r, f"overlap {mode}, {label}")
            ok = m["resting"]["total"] == m["predicted"]["resting_total"] and m["peak"]["total"] == m["predicted"]["peak_total"]
            comm = [c for c in m["comm"].values() if c["calls"] > 0]
            ms = sum(c["ms"] for c in comm)
            exposed = [c.get("exposed_ms") for c in comm]
            has_exposed = all(isinstance(e, (int, float)) for e in exposed) and bool(exposed)
            within = all(c["exposed_ms"] <= c["ms"] + 1e-9 for c in comm) if has_exposed else None
            if has_exposed and not within:
                problem(f"overlap {mode}, {label}: a collective's exposed_ms exceeds its ms: {m['comm']}")
            if not has_exposed:
                problem(f"overlap {mode}, {label}: the collectives carry no exposed_ms")
            seen[mode] = (m["resting"]["total"], m["peak"]["total"])
            exposed_cells = f"{sum(exposed):.3f} | {'yes' if within else 'NO'}" if has_exposed else "- | -"
            say(f"| {label} | {mode} | {m['resting']['total']:,} | {m['peak']['total']:,} | {'yes' if ok else 'NO'} | "
                f"{ms:.3f} | {exposed_cells} | {fmt(m['step_ms'].get('median'))} |")
        if len(seen) == 2 and seen["on"][0] != seen["off"][0]:
            problem(f"overlap, {label}: resting bytes differ between on and off: {seen}")
say("")

# ---- 3. transformers on cuda -----------------------------------------------------------------
say("## Transformers on cuda beside cpu")
say("")
say("| model | strategy | world | cuda resting | cuda peak | cpu + workspace equal | measured == predicted |")
say("|---|---|---|---|---|---|---|")
for model, shape in (("gpt2", GPT2), ("llama", LLAMA)):
    for strat, extra, em in (("ddp", [], []), ("zero3", ["--units", "1"], []), ("zero3", ["--units", "1"], ["--emulate", "2:1"])):
        tag = f"{model}-{strat}-{'w2' if em else 'w1'}"
        args = shape + ["--strategy", strat, *extra, *em]
        c, p = run(args + ["--backend", "cuda"], tag + "-cuda"), run(args + ["--backend", "cpu"], tag + "-cpu")
        world = "2 (emulated, rank 1)" if em else "1"
        if "error" in c or "error" in p:
            say(f"| {model} | {strat} | {world} | {c.get('error', 'ok')} | {p.get('error', 'ok')} | | |")
            problem(f"{model} {strat} W={world}: cuda {c.get('error', 'ok')}; cpu {p.get('error', 'ok')}")
            continue
        before = len(problems)
        check_predicted(c, f"{model} {strat} W={world} cuda")
        predicted = len(problems) == before
        same = same_bytes_as_cpu(c, p, f"{model} {strat} W={world}")
        m = c["ranks"][0]
        say(f"| {model} | {strat} {' '.join(extra)} | {world} | {m['resting']['total']:,} | {m['peak']['total']:,} | "
            f"{'yes' if same else 'NO'} | {'yes' if predicted else 'NO'} |")
say("")

# ---- 4. bf16 ------------------------------------------------------------------------------------
say("## bf16 (--precision bf16) on cuda beside cpu")
say("")
bf16, why = accepts(["--precision", "bf16"])
if not bf16:
    say(f"not run: this binary does not run --precision bf16 ({why or 'no such flag'})")
else:
    say("| model | strategy | cuda resting | cuda peak | cpu + workspace equal | measured == predicted |")
    say("|---|---|---|---|---|---|")
    for model, shape in (("mlp", SMALL), ("gpt2", GPT2)):
        for strat, extra in (("ddp", []), ("zero3", ["--units", "1"])):
            args = shape + ["--strategy", strat, *extra, "--precision", "bf16"]
            tag = f"bf16-{model}-{strat}"
            c, p = run(args + ["--backend", "cuda"], tag + "-cuda"), run(args + ["--backend", "cpu"], tag + "-cpu")
            if "error" in c or "error" in p:
                say(f"| {model} | {strat} | {c.get('error', 'ok')} | {p.get('error', 'ok')} | | |")
                problem(f"bf16 {model} {strat}: cuda {c.get('error', 'ok')}; cpu {p.get('error', 'ok')}")
                continue
            before = len(problems)
            check_predicted(c, f"bf16 {model} {strat} cuda")
            predicted = len(problems) == before
            same = same_bytes_as_cpu(c, p, f"bf16 {model} {strat}")
            m = c["ranks"][0]
            say(f"| {model} | {strat} | {m['resting']['total']:,} | {m['peak']['total']:,} | {'yes' if same else 'NO'} | "
                f"{'yes' if predicted else 'NO'} |")
say("")
sys.exit(1 if problems else 0)

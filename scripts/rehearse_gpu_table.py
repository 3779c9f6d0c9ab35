#!/usr/bin/env python3
"""Rehearses scripts/gpu_table.py on a machine without a GPU, so that a change to it is
tried before it spends lent device time.

A stand-in `shardscope` runs the real (cpu) binary with `--backend cuda` turned into cpu and
`--comm nccl` into self, and adds the pool figures a cuda run reports (the pool's used
bytes equal to the tracker's rounded figures, one byte outside the pool). Every part of the
table then runs for real on the cpu; the two NCCL checks cannot pass without NCCL and are
expected among the Problems. Takes a few minutes (the 8 x 4096 runs on the cpu).

Usage: scripts/rehearse_gpu_table.py [BUILD_DIR]   (default build/; writes to a temp folder)
Exit 0 when the table ran to the end and its only problems are the two NCCL ones.
"""
import os
import shutil
import subprocess
import sys
import tempfile

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "build"))
real = os.path.join(build, "shardscope")
if not os.access(real, os.X_OK):
    sys.exit(f"rehearse_gpu_table: no shardscope binary in {build}: build first (scripts/build.sh)")

STAND_IN = r'''#!/usr/bin/env python3
import json, os, subprocess, sys
args = ["cpu" if a == "cuda" else "self" if a == "nccl" else a for a in sys.argv[1:] if a != "--tf32"]
path = next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "--json"), None)
r = subprocess.run([REAL] + args)
if r.returncode == 0 and path and os.path.exists(path) and os.environ.get("OMPI_COMM_WORLD_RANK", "0") == "0":
    doc = json.load(open(path))
    doc["backend"] = "cuda"
    for run in doc["runs"]:
        run["backend"] = "cuda"
        for k in run.get("ranks", []) + run.get("stages", []):
            k["pool"] = {"used_current": k["rounded"]["resting_total"], "used_high": k["rounded"]["peak_total"],
                         "reserved_current": 0, "reserved_high": 0}
            k["outside_pool_bytes"] = 1
    json.dump(doc, open(path, "w"))
sys.exit(r.returncode)
'''

work = tempfile.mkdtemp(prefix="gpu-rehearsal-")
try:
    fake_build, out = os.path.join(work, "build"), os.path.join(work, "out")
    os.makedirs(fake_build)
    os.makedirs(out)
    stand_in = os.path.join(fake_build, "shardscope")
    with open(stand_in, "w") as f:
        f.write(STAND_IN.replace("REAL", repr(real)))
    os.chmod(stand_in, 0o755)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    subprocess.run([sys.executable, os.path.join(root, "scripts", "gpu_table.py"), fake_build, out], env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(os.path.join(out, "gpu-table.md")) as f:
        table = f.read()
    problems = [l[2:] for l in table.split("## Problems", 1)[-1].splitlines() if l.startswith("- ")]
    expected = [p for p in problems if p.startswith("NCCL")]
    for p in problems:
        print(("expected without NCCL: " if p in expected else "PROBLEM: ") + p)
    ran_to_the_end = "## Step time" in table and "## Problems" in table
    print("rehearsal:", "passed" if ran_to_the_end and len(expected) == len(problems) == 2 else "FAILED")
    sys.exit(0 if ran_to_the_end and len(expected) == len(problems) == 2 else 1)
finally:
    shutil.rmtree(work, ignore_errors=True)

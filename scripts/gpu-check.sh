#!/usr/bin/env bash
# Builds shardscope on the lent GPU machine and runs its tests there.
#
# That machine has CUDA 13, CMake, ninja and PyTorch, but no apt, no MPI, no GoogleTest
# and probably no OpenBLAS, nlohmann_json or CLI11: run scripts/prepare-carry.sh here
# first and carry .carry/ along. NCCL comes from CUDA if present, else from PyTorch's
# nvidia-nccl wheel.
#
# Checks, in order: the build (warnings counted), the CUDA tests, the CPU unit tests, the
# seed's table (scripts/gpu_table.py), that the binary does not need libnvidia-ml, the
# watchdog (a stalled stream on one GPU; with mpirun, two ranks, one asleep past
# --comm-timeout), the GPU paths (scripts/gpu_paths.py: memory outside the pool by part,
# NCCL per communicator, overlap on and off, gpt2 and llama on cuda, bf16 when present),
# and an Nsight Systems capture when nsys is there.
#
# Writes to $OUT (default ./gpu-out) at most 8 files (the device tool brings back 8):
# environment.txt, build.log (configure + build), cuda-tests.log, unit-tests.log,
# table.log, gpu-table.md (both tables), nsys.txt (when nsys is present), summary.txt. Exit 0 when the
# build and every test passed, no CUDA test was skipped for want of a GPU, and every
# comparison of the table held; 1 otherwise (the summary says which step failed).
# Every step has its own time limit, and all of them together stay inside BUDGET
# seconds (default 540; one device command may take 600): a step that would start with
# too little time left is reported as not run.
#
#   bash scripts/gpu-check.sh            # from the repository root, or anywhere
#   BUILD_DIR=build-gpu JOBS=16 OUT=/tmp/o bash scripts/gpu-check.sh
#   ONLY_CUDA=1 bash scripts/gpu-check.sh   # build and run only shardscope_cuda_tests
#   DRY_RUN=1 bash scripts/gpu-check.sh     # print the steps and their limits, run nothing
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${OUT:-$root/gpu-out}"
build="${BUILD_DIR:-$root/build-gpu}"
jobs="${JOBS:-16}"
only_cuda="${ONLY_CUDA:-0}"
mkdir -p "$out"
summary="$out/summary.txt"
: >"$summary"
failed=0

say() { echo "gpu-check: $*" | tee -a "$summary"; }
fail() { say "FAILED: $*"; failed=1; }
budget="${BUDGET:-540}"
# The limit for a step that wants $1 seconds: what the budget still allows (0: none).
limit() {
  local left=$((budget - SECONDS - 5))
  if ((left < 10)); then echo 0; elif ((left < $1)); then echo "$left"; else echo "$1"; fi
}

# DRY_RUN=1: say what would run, with each step's limit, check that the scripts it calls are
# there and parse, and stop (for a machine without a GPU, before device time is spent).
if [[ "${DRY_RUN:-0}" == 1 ]]; then
  say "dry run: nothing is built or run; OUT=$out BUILD_DIR=$build JOBS=$jobs BUDGET=$budget s"
  say "dry run: steps: configure (90 s), build (300 s), cuda tests (120 s), cpu unit tests (60 s),"
  say "dry run:   table (scripts/gpu_table.py, 200 s), nvml not linked, watchdog one GPU (25 s),"
  say "dry run:   watchdog two ranks (with mpirun, 40 s each), gpu paths (scripts/gpu_paths.py, 150 s), nsys (90 s)"
  for script in gpu_table.py gpu_paths.py; do
    if python3 -c 'import ast, sys; ast.parse(open(sys.argv[1]).read())' "$root/scripts/$script" 2>>"$summary"; then
      say "dry run: scripts/$script parses"
    else fail "dry run: scripts/$script does not parse"; fi
  done
  for tool in nvcc cmake ninja nvidia-smi mpirun nsys; do
    say "dry run: $tool: $(command -v "$tool" 2>/dev/null || echo 'not on PATH')"
  done
  say "done: $( [[ $failed == 0 ]] && echo 'dry run passed' || echo 'dry run FAILED' )"
  exit $failed
fi

# ---- 1. what is present ---------------------------------------------------------------
nvcc_bin=""
for c in "$(command -v nvcc 2>/dev/null || true)" /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc; do
  if [[ -n "$c" && -x "$c" ]]; then nvcc_bin="$c"; break; fi
done

# NCCL: the toolkit's own, else the nvidia-nccl wheel that PyTorch uses.
nccl_flags=()
nccl_where="not found"
if [[ -f /usr/local/cuda/include/nccl.h ]]; then
  nccl_where="CUDA toolkit (/usr/local/cuda)"
else
  nccl_dir="$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)"
  nccl_lib="$(ls "$nccl_dir"/lib/libnccl.so* 2>/dev/null | head -n 1 || true)"
  if [[ -n "$nccl_dir" && -f "$nccl_dir/include/nccl.h" && -n "$nccl_lib" ]]; then
    nccl_flags=(-DSHARDSCOPE_NCCL_LIBRARY="$nccl_lib" -DSHARDSCOPE_NCCL_INCLUDE="$nccl_dir/include")
    nccl_where="PyTorch's wheel ($nccl_lib)"
  fi
fi

{
  echo "== date";        date -u
  echo "== host";        uname -a; nproc
  echo "== nvidia-smi";  nvidia-smi 2>&1 || echo "(nvidia-smi failed)"
  echo "== nvcc ($nvcc_bin)"; [[ -n "$nvcc_bin" ]] && "$nvcc_bin" --version 2>&1 || echo "(nvcc not found)"
  echo "== cmake";       cmake --version 2>&1 || echo "(cmake not found)"
  echo "== ninja";       ninja --version 2>&1 || echo "(ninja not found)"
  echo "== c++";         c++ --version 2>&1 | head -n 1 || echo "(c++ not found)"
  echo "== python/torch"
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.is_available() and torch.cuda.get_device_name(0))' 2>&1 ||
    echo "(torch not importable)"
  echo "== nccl: $nccl_where"
  echo "== carried: $(ls -d .carry/googletest .carry/include/nlohmann .carry/include/CLI 2>/dev/null | tr '\n' ' ')"
} >"$out/environment.txt" 2>&1
say "environment written to environment.txt (nvcc: ${nvcc_bin:-none}; nccl: $nccl_where)"
gpu_line="$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1 || true)"
say "gpu: ${gpu_line:-none reported by nvidia-smi}"

if [[ -z "$nvcc_bin" ]]; then
  fail "no nvcc: the CUDA backend cannot be built here"
  exit 1
fi
if [[ ! -f .carry/googletest/CMakeLists.txt ]]; then
  say "warning: .carry/googletest is missing (run scripts/prepare-carry.sh and carry .carry): the configure step needs GoogleTest"
fi

# ---- 2. configure and build -------------------------------------------------------------
cmake_args=(-S "$root" -B "$build" -G Ninja
  -DCMAKE_BUILD_TYPE=Release
  -DCMAKE_CUDA_COMPILER="$nvcc_bin"
  -DCMAKE_CUDA_ARCHITECTURES=90
  -DSHARDSCOPE_GTEST_SOURCE="$root/.carry/googletest"
  -DSHARDSCOPE_EXTRA_INCLUDE="$root/.carry/include"
  "${nccl_flags[@]}")
if timeout 90 cmake "${cmake_args[@]}" >"$out/build.log" 2>&1; then
  say "configure: ok ($(grep -m1 'shardscope: cuda=' "$out/build.log" | sed 's/^-- //'))"
else
  fail "configure (see build.log)"
  tail -n 20 "$out/build.log" | sed 's/^/gpu-check:   /' | tee -a "$summary"
  exit 1
fi

# -k 0: build every target that can be built, so one broken file does not hide the rest.
targets=()
[[ "$only_cuda" == 1 ]] && targets=(shardscope_cuda_tests)
echo "== ninja" >>"$out/build.log"
build_rc=0
build_limit="$(limit 300)"
if [[ "$build_limit" == 0 ]]; then
  build_rc=124  # (timeout 0 would mean no limit at all)
else
  timeout "$build_limit" ninja -C "$build" -j "$jobs" -k 0 "${targets[@]}" >>"$out/build.log" 2>&1 || build_rc=$?
fi
if [[ $build_rc == 0 ]]; then
  say "build: ok"
elif [[ $build_rc == 124 ]]; then
  fail "build: stopped at its time limit (see build.log); running the test binaries that were built"
else
  fail "build (see build.log); running the test binaries that were built"
  { grep -E "error:|FAILED:" "$out/build.log" | head -n 15 | sed 's/^/gpu-check:   /' | tee -a "$summary"; } || true
fi
warnings=$(grep -c "warning:" "$out/build.log" || true)
say "build warnings: $warnings"

# ---- 3. tests -------------------------------------------------------------------------
# The environment ctest would give them (tests/CMakeLists.txt: SHARDSCOPE_TEST_ENV).
export OPENBLAS_NUM_THREADS=1
export SHARDSCOPE_BIN="$build/shardscope"
export SHARDSCOPE_REFERENCE_DIR="$root/tests/reference"

run_tests() {  # name binary log seconds
  local name="$1" bin="$2" log="$3" limit="$4"
  if [[ ! -x "$bin" ]]; then
    fail "$name: $bin was not built"
    return
  fi
  if [[ "$limit" == 0 ]]; then
    fail "$name: not run, the time budget ($budget s) is spent"
    return
  fi
  if timeout "$limit" "$bin" --gtest_color=no >"$log" 2>&1; then
    say "$name: $(grep -E '^\[  PASSED  \]' "$log" | tail -n 1)$(grep -E '^\[  SKIPPED \] [0-9]+ test' "$log" | sed -e 's/^\[  SKIPPED \]/, skipped/' -e 's/, listed below://' | tail -n 1)"
  else
    fail "$name (exit $?; see $(basename "$log"))"
    grep -E '^\[  FAILED  \]' "$log" | sed 's/^/gpu-check:   /' | tee -a "$summary" || true
  fi
}

run_tests "cuda tests" "$build/tests/shardscope_cuda_tests" "$out/cuda-tests.log" "$(limit 120)"
# A CUDA test skips when it finds no GPU: here that is a failure, not a pass.
if grep -q "no CUDA device is visible" "$out/cuda-tests.log" 2>/dev/null; then
  fail "cuda tests: skipped for want of a visible GPU ($(grep -c 'no CUDA device is visible' "$out/cuda-tests.log") tests)"
fi
# The figures the CUDA tests print: pool rounding, tracker vs pool, device, NVML.
grep -E '^\[(pool-rounding|pool|device)\]' "$out/cuda-tests.log" 2>/dev/null | tee -a "$summary" || true
if [[ "$only_cuda" == 1 ]]; then
  say "cpu unit tests: not run (ONLY_CUDA=1)"
else
  run_tests "cpu unit tests" "$build/tests/shardscope_tests" "$out/unit-tests.log" "$(limit 60)"
fi

# ---- 4. the table: cuda vs cpu bytes for the seed's configurations, pool vs tracker,
# outside-pool bytes, and the step time of 8 x 4096 beside PyTorch eager ---------------
table_limit="$(limit 200)"
if [[ -x "$build/shardscope" && "$table_limit" == 0 ]]; then
  fail "table: not run, the time budget ($budget s) is spent"
elif [[ -x "$build/shardscope" ]]; then
  # The table script spends at most DEADLINE seconds (it cuts its own runs short), and
  # writes gpu-table.md even when timeout stops it (it handles SIGTERM).
  if GPU_TABLE_DEADLINE=$((table_limit - 10)) timeout "$table_limit" python3 "$root/scripts/gpu_table.py" \
       "$build" "$out" >"$out/table.log" 2>&1; then
    say "table: written to gpu-table.md, every comparison held"
  else
    fail "table: see the Problems at the end of gpu-table.md (and table.log)"
    { sed -n '/^## Problems/,$p' "$out/gpu-table.md" 2>/dev/null | head -n 15 | sed 's/^/gpu-check:   /' |
        tee -a "$summary"; } || true
  fi
else
  fail "table: shardscope was not built"
fi
# ---- 4b. NVML at run time only, and the watchdog on one GPU ----------------------------
if [[ -x "$build/shardscope" ]]; then
  if ldd "$build/shardscope" | grep -q nvidia-ml; then
    fail "nvml: the binary needs libnvidia-ml at load time: $(ldd "$build/shardscope" | grep nvidia-ml | head -n 1)"
  else
    say "nvml: not among the libraries the binary needs (loaded at run time)"
  fi
fi
# One GPU and no MPI: there is no second rank to stop, so the test hook stalls this rank's
# stream instead (a host function sleeps 8 s before its first all-reduce). The watchdog
# must end the run with exit 3 after --comm-timeout 2 s, aborting the communicator, with
# one line naming the rank, the collective, its bytes and the timeout; the process ends
# once the sleeping host function returns (within --comm-timeout + 10 s).
if [[ -x "$build/shardscope" && "$(limit 30)" -ge 30 ]]; then
  wd_err="$(mktemp)"
  wd_t0=$SECONDS
  wd_rc=0
  SHARDSCOPE_TEST_STALL=0:8 timeout 25 "$build/shardscope" run --backend cuda --comm nccl --comm-timeout 2 \
    --layers 2 --width 64 --steps 3 >/dev/null 2>"$wd_err" || wd_rc=$?
  wd_s=$((SECONDS - wd_t0))
  wd_line="$(grep -m1 'shardscope: error:' "$wd_err" || head -n 1 "$wd_err")"
  if [[ $wd_rc == 3 && $wd_s -le 12 && "$wd_line" == *"all_reduce of 33280 B did not complete within --comm-timeout 2 s"* ]]; then
    say "watchdog (nccl, stalled stream): exit 3 after ${wd_s} s: $wd_line"
  else
    fail "watchdog (nccl, stalled stream): exit $wd_rc after ${wd_s} s (want 3 within 12 s): $wd_line"
  fi
  rm -f "$wd_err"
else
  say "watchdog: not run (no binary, or too little of the time budget left)"
fi
# With MPI (not on the lent machine, but on a cluster node): two ranks, rank 1 asleep for
# 30 s before its first all-reduce (the same hook, on the host), rank 0's watchdog ends the
# job with exit 3 within --comm-timeout 2 s + 10 s. --comm mpi, so that one GPU serves both;
# with two GPUs, NCCL's watchdog too.
mpirun_bin="$(command -v mpirun 2>/dev/null || true)"
if [[ -x "$build/shardscope" && -n "$mpirun_bin" && "$(limit 60)" -ge 60 ]]; then
  gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)"
  comms=(mpi)
  ((gpus >= 2)) && comms+=(nccl)
  for comm in "${comms[@]}"; do
    wd_err="$(mktemp)"
    wd_t0=$SECONDS
    wd_rc=0
    SHARDSCOPE_TEST_STALL=1:30 timeout 40 "$mpirun_bin" --allow-run-as-root -np 2 --oversubscribe -x SHARDSCOPE_TEST_STALL \
      "$build/shardscope" run --backend cuda --comm "$comm" --comm-timeout 2 --layers 2 --width 64 --steps 3 \
      >/dev/null 2>"$wd_err" || wd_rc=$?
    wd_s=$((SECONDS - wd_t0))
    wd_line="$(grep -m1 'shardscope: error:' "$wd_err" || head -n 1 "$wd_err")"
    if [[ $wd_rc == 3 && $wd_s -le 12 && "$wd_line" == *"rank 0: all_reduce of 33280 B did not complete within --comm-timeout 2 s"* ]]; then
      say "watchdog ($comm, two ranks, rank 1 asleep 30 s): exit 3 after ${wd_s} s: $wd_line"
    else
      fail "watchdog ($comm, two ranks, rank 1 asleep 30 s): exit $wd_rc after ${wd_s} s (want 3 within 12 s): $wd_line"
    fi
    rm -f "$wd_err"
  done
else
  say "watchdog with two ranks: not run (no mpirun here, or too little of the time budget left)"
fi

# ---- 4c. the GPU paths: whole-device memory (context, cuBLAS, NCCL per communicator),
# overlap on and off, transformers on cuda, bf16 (each when the binary has it) ------------
paths_limit="$(limit 150)"
if [[ -x "$build/shardscope" && "$paths_limit" != 0 ]]; then
  # Appends its own section and Problems to gpu-table.md; its log goes to table.log.
  if GPU_TABLE_DEADLINE=$((paths_limit - 10)) timeout "$paths_limit" python3 "$root/scripts/gpu_paths.py" \
       "$build" "$out" >>"$out/table.log" 2>&1; then
    say "gpu paths: appended to gpu-table.md, every check held"
  else
    fail "gpu paths: see 'Problems (GPU paths)' at the end of gpu-table.md (and table.log)"
    { sed -n '/^## Problems (GPU paths)/,$p' "$out/gpu-table.md" 2>/dev/null | head -n 15 | sed 's/^/gpu-check:   /' |
        tee -a "$summary"; } || true
  fi
else
  fail "gpu paths: not run (no binary, or the time budget ($budget s) is spent)"
fi

# ---- 4c. overlap on one GPU: the non-blocking collectives on NCCL's communication stream
# (--overlap on, W = 1, so a ddp of small buckets, zero2's reduce-scatters and zero3's
# prefetch and reduce-scatters, torch and fsdp2 engines, run through the post/event/wait
# path) against --overlap off: exit 0, measured == predicted bytes (the buffers in flight
# held until their wait), and every collective's exposed_ms within its ms (all of it with
# overlap off).
if [[ -x "$build/shardscope" && "$(limit 60)" -ge 60 ]]; then
  ov_dir="$(mktemp -d)"
  ov_ok=1
  ov_text=""
  for ov_run in "ddp --bucket-mb 0.05" "zero2 --units 1" "zero3 --units 1" "zero3 --units 1 --engine fsdp2"; do
    for ov in on off; do
      ov_json="$ov_dir/$(tr -c 'a-z0-9\n' '_' <<< "$ov_run")-$ov.json"
      # shellcheck disable=SC2086
      if ! timeout 30 "$build/shardscope" run --backend cuda --comm nccl --strategy $ov_run --overlap "$ov" \
           --layers 4 --width 256 --steps 3 --json "$ov_json" >/dev/null 2>"$ov_dir/err"; then
        ov_ok=0
        ov_text+=" ${ov_run%% *}/$ov: $(head -n 1 "$ov_dir/err");"
        continue
      fi
      ov_text+=" $(python3 - "$ov_json" "$ov" <<'PY'
import json, sys
run = json.load(open(sys.argv[1]))["runs"][0]
rank = run["ranks"][0]
problems = []
if rank["peak"]["total"] != rank["predicted"]["peak_total"]: problems.append("peak != predicted")
if rank["resting"] != rank["predicted"]["resting"]: problems.append("resting != predicted")
ms = sum(c["ms"] for c in rank["comm"].values())
exposed = sum(c["exposed_ms"] for c in rank["comm"].values())
for kind, c in rank["comm"].items():
    if c["exposed_ms"] > c["ms"] or (sys.argv[2] == "off" and c["exposed_ms"] != c["ms"]):
        problems.append(kind + " exposed_ms " + str(c["exposed_ms"]) + " vs ms " + str(c["ms"]))
print(run["strategy"] + ("" if run.get("engine", "torch") == "torch" else " " + run["engine"]) + "/" + sys.argv[2] + ": comm %.3f ms, exposed %.3f ms" % (ms, exposed) +
      ("" if not problems else " PROBLEMS " + ", ".join(problems)) + ";")
sys.exit(1 if problems else 0)
PY
)" || ov_ok=0
    done
  done
  if [[ $ov_ok == 1 ]]; then say "overlap (nccl, W = 1):$ov_text"; else fail "overlap (nccl, W = 1):$ov_text"; fi
  rm -rf "$ov_dir"
else
  say "overlap: not run (no binary, or too little of the time budget left)"
fi

# ---- 5. Nsight Systems, when present: one short zero3 run (its prefetch posted on the
# communication stream, --overlap on), NVTX summary -------------------------------------
if command -v nsys >/dev/null 2>&1 && [[ -x "$build/shardscope" && "$(limit 90)" -ge 90 ]]; then
  rep_dir="$(mktemp -d)"
  if timeout 60 nsys profile -t cuda,nvtx -o "$rep_dir/zero3" --force-overwrite true \
       "$build/shardscope" run --backend cuda --strategy zero3 --units 1 --steps 3 >"$out/nsys.txt" 2>&1 &&
     echo "== nsys stats --report nvtx_sum" >>"$out/nsys.txt" &&
     timeout 30 nsys stats --report nvtx_sum "$rep_dir/zero3.nsys-rep" >>"$out/nsys.txt" 2>&1; then
    say "nsys: NVTX summary in nsys.txt ($(grep -c shardscope "$out/nsys.txt" || true) shardscope lines)"
  else
    fail "nsys (see nsys.txt)"
  fi
  rm -rf "$rep_dir"
else
  if command -v nsys >/dev/null 2>&1; then say "nsys: not run, too little of the time budget left"
  else say "nsys: not on this machine"; fi
fi
say "done: $( [[ $failed == 0 ]] && echo passed || echo FAILED )"
exit $failed

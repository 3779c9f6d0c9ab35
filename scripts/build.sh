#!/usr/bin/env bash
# Configures and builds into build/ (CUDA targets too when nvcc is found, sm_90): every
# target, or only those named (scripts/build.sh shardscope).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
# The configure line that says what was found (cuda=, mpi=, blas=) stays in the log.
cmake --preset default | { grep -E "^-- shardscope:|[Ww]arning" || true; }
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build --preset default -j "$(nproc)" "${targets[@]}"

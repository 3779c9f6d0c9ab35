#!/usr/bin/env bash
# Configures and builds into build/ (CUDA targets too when nvcc is found, sm_90).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
# The configure line that says what was found (cuda=, mpi=, blas=) stays in the log.
cmake --preset default | { grep -E "^-- shardscope:|[Ww]arning" || true; }
cmake --build --preset default -j "$(nproc)"

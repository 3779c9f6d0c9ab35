#!/usr/bin/env bash
# Configures and builds into build/ (CUDA targets too when nvcc is found, sm_90).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake --preset default >/dev/null
cmake --build --preset default -j "$(nproc)"

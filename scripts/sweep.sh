#!/usr/bin/env bash
# The default sweep (the seed's experiment): installs what is missing, builds, runs
# `shardscope sweep` with any extra flags given here, writes results/shardscope.json.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OPENBLAS_NUM_THREADS=1
exec build/shardscope sweep "$@"

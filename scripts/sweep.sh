#!/usr/bin/env bash
# The default sweep (the seed's experiment): installs what is missing, builds the
# shardscope binary alone (not the tests or benchmarks), runs `shardscope sweep` with any
# extra flags given here, writes results/shardscope.json. The build's progress and time go
# to stderr; stdout holds the sweep's tables.
# Paths given here (--out, --report, --csv, --trace) are taken from where it is run.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
start=$SECONDS
"$root/scripts/build.sh" shardscope >&2
echo "scripts/sweep.sh: built shardscope in $((SECONDS - start)) s" >&2
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OPENBLAS_NUM_THREADS=1
exec "$root/build/shardscope" sweep "$@"

#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, runs ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
# Chromium renders the HTML report in its browser test. Installed here, once and in
# view, rather than by the test; without it that test says why it cannot run.
scripts/deps.sh chromium ||
  echo "scripts/test.sh: warning: chromium could not be installed; the report's browser test will say so" >&2
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OPENBLAS_NUM_THREADS=1
ctest --preset default -j "$(nproc)" "$@"

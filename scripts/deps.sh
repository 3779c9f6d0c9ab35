#!/usr/bin/env bash
# Installs the Debian packages shardscope builds with, when any is missing.
# Idempotent and quick when everything is present; run as root (or with sudo).
set -euo pipefail
packages=(cmake ninja-build g++ libopenmpi-dev openmpi-bin libopenblas-dev nlohmann-json3-dev
          libcli11-dev libgtest-dev libbenchmark-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "scripts/deps.sh: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get install -y --no-install-recommends "${missing[@]}" ||
  { $SUDO apt-get update && $SUDO apt-get install -y --no-install-recommends "${missing[@]}"; }

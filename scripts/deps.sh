#!/usr/bin/env bash
# Installs the Debian packages shardscope builds with, when any is missing, and any
# extra packages named as arguments (scripts/test.sh asks for chromium, for the report's
# browser test). Idempotent and quick when everything is present; run as root (or with
# sudo).
set -euo pipefail
packages=(cmake ninja-build g++ libopenmpi-dev openmpi-bin libopenblas-dev nlohmann-json3-dev
          libcli11-dev libgtest-dev libbenchmark-dev "$@")
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "scripts/deps.sh: missing ${missing[*]}; not root and no sudo: install them as root" >&2
    exit 1
  fi
  SUDO=(sudo)
fi
echo "scripts/deps.sh: installing ${missing[*]}"
# `env` inside sudo: sudo drops DEBIAN_FRONTEND, and debconf would prompt.
apt=("${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300)
"${apt[@]}" install -y --no-install-recommends "${missing[@]}" ||
  { "${apt[@]}" update && "${apt[@]}" install -y --no-install-recommends "${missing[@]}"; }

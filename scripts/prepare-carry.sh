#!/usr/bin/env bash
# Fills .carry/ (git-ignored) on this machine with what the lent GPU machine lacks and
# cannot fetch (it has no apt and no network): GoogleTest's source, and the header-only
# nlohmann/json and CLI11. scripts/gpu-check.sh points CMake at them:
#   .carry/googletest/   <- /usr/src/googletest (CMakeLists.txt, googletest/, googlemock/)
#   .carry/include/      <- /usr/include/nlohmann, /usr/include/CLI
# Never commit .carry/. Needs: googletest (or libgtest-dev), nlohmann-json3-dev, libcli11-dev.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
carry="$root/.carry"

die() { echo "prepare-carry: error: $*" >&2; exit 1; }

gtest_src=/usr/src/googletest
[[ -f "$gtest_src/CMakeLists.txt" && -d "$gtest_src/googletest" ]] ||
  die "$gtest_src not found (apt-get install googletest)"
[[ -f /usr/include/nlohmann/json.hpp ]] || die "/usr/include/nlohmann/json.hpp not found (apt-get install nlohmann-json3-dev)"
[[ -f /usr/include/CLI/CLI.hpp ]] || die "/usr/include/CLI/CLI.hpp not found (apt-get install libcli11-dev)"

git -C "$root" check-ignore -q .carry/ ||
  die ".carry/ is not git-ignored in $root: refusing to fill a folder that could be committed"

rm -rf "$carry/googletest" "$carry/include/nlohmann" "$carry/include/CLI"
mkdir -p "$carry/googletest" "$carry/include"
cp "$gtest_src/CMakeLists.txt" "$carry/googletest/"
cp -r "$gtest_src/googletest" "$carry/googletest/"
[[ -d "$gtest_src/googlemock" ]] && cp -r "$gtest_src/googlemock" "$carry/googletest/"
cp -r /usr/include/nlohmann "$carry/include/"
cp -r /usr/include/CLI "$carry/include/"

echo "prepare-carry: filled $carry ($(du -sh "$carry" | cut -f1)):"
echo "  googletest/  from $gtest_src"
echo "  include/nlohmann, include/CLI  from /usr/include"
echo "prepare-carry: name .carry in the device tool's carry list, then run scripts/gpu-check.sh there"

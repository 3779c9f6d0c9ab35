#!/usr/bin/env bash
# shardscope's step beside PyTorch eager's on the same model, both on one core.
#
# Model: L x Linear(w, w) + ReLU, MSE against ones, AdamW (torch defaults), batch B.
# Configurations: 8 x 256 batch 32 (aim: shardscope / torch <= 0.8) and 8 x 64 batch 8
# (aim <= 0.33). Each round runs shardscope, then torch (alternated, so that a drift in
# the machine's speed hits both); a round's ratio is shardscope's median step over
# torch's. Printed per round, then per configuration: the median of each side's medians,
# and the median (min-max) of the round ratios.
#   shardscope: `shardscope run ... --backend cpu --steps N --json f`, step_ms.median
#               (every step but the first; one OpenBLAS thread)
#   torch:      bench/torch_compare.py, torch.set_num_threads(1), median of N steps
#               after 10 warm-up steps, timed in Python around each step
#
# Usage: bench/torch_compare.sh [ROUNDS]          (default 5)
# Environment: SHARDSCOPE  the binary (default build/shardscope)
#              PYTHON      an interpreter with torch (default python3)
#              STEPS       steps per run (default 200)
#              CPU         the core both are pinned to with taskset (default 0; empty: no pin)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
rounds=${1:-5}
shardscope=${SHARDSCOPE:-$root/build/shardscope}
python=${PYTHON:-python3}
steps=${STEPS:-200}
cpu=${CPU-0}

# One thread for every BLAS and OpenMP runtime either side might load.
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

if [[ ! -x $shardscope ]]; then
  echo "torch_compare: no shardscope binary at $shardscope (build it, or set SHARDSCOPE)" >&2
  exit 2
fi
if ! "$python" -c 'import torch' 2>/dev/null; then
  echo "torch_compare: skipped: PyTorch is not importable by $python." >&2
  echo "  install it: $python -m pip install torch --index-url https://download.pytorch.org/whl/cpu" >&2
  echo "  (or plain 'pip install torch' from PyPI), or point PYTHON at an interpreter that has it" >&2
  exit 2
fi

pin=()
if [[ -n $cpu ]] && command -v taskset >/dev/null; then pin=(taskset -c "$cpu"); fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The median step ms of a shardscope JSON document (the one rank's step_ms.median).
json_median() {
  "$python" -c 'import json,sys; print(json.load(open(sys.argv[1]))["runs"][0]["ranks"][0]["step_ms"]["median"])' "$1"
}
median() { sort -g | awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }

model=$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')
family=$(grep -m1 '^cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')
cpumodel=$(grep -m1 '^model[[:space:]]*:' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')
echo "torch_compare: CPU $model (family $family, model $cpumodel, $(grep -c ^processor /proc/cpuinfo) logical CPUs)" \
     "pinned to ${cpu:-none}; $("$python" -c 'import warnings; warnings.filterwarnings("ignore"); import torch; print("torch", torch.__version__)')"
echo "steps per run $steps; $rounds rounds; ms are medians of a run's steps"
echo

summary=()
for conf in "8 256 32 0.8" "8 64 8 0.33"; do
  read -r layers width batch aim <<<"$conf"
  : >"$tmp/ss" ; : >"$tmp/pt" ; : >"$tmp/ratio"
  printf '%-14s %5s %14s %12s %8s\n' "config" "round" "shardscope ms" "torch ms" "ratio"
  for ((r = 1; r <= rounds; r++)); do
    "${pin[@]}" "$shardscope" run --layers "$layers" --width "$width" --batch "$batch" \
      --activation relu --loss mse --steps "$steps" --backend cpu --json "$tmp/ss.json" >/dev/null
    ss=$(json_median "$tmp/ss.json")
    pt=$("${pin[@]}" "$python" "$here/torch_compare.py" --layers "$layers" --width "$width" \
           --batch "$batch" --steps "$steps" |
         "$python" -c 'import json,sys; print(json.load(sys.stdin)["median_ms"])')
    ratio=$(awk -v a="$ss" -v b="$pt" 'BEGIN {printf "%.3f", a / b}')
    echo "$ss" >>"$tmp/ss"; echo "$pt" >>"$tmp/pt"; echo "$ratio" >>"$tmp/ratio"
    printf '%-14s %5d %14.4f %12.4f %8s\n' "${layers}x${width} b${batch}" "$r" "$ss" "$pt" "$ratio"
  done
  ss_med=$(median <"$tmp/ss"); pt_med=$(median <"$tmp/pt"); r_med=$(median <"$tmp/ratio")
  r_min=$(sort -g "$tmp/ratio" | head -1); r_max=$(sort -g "$tmp/ratio" | tail -1)
  summary+=("$(printf '%-14s %14.4f %12.4f %8.3f  (%s-%s)  aim <= %s' "${layers}x${width} b${batch}" \
              "$ss_med" "$pt_med" "$r_med" "$r_min" "$r_max" "$aim")")
  echo
done

printf '%-14s %14s %12s %8s\n' "config" "shardscope ms" "torch ms" "ratio (median, min-max of rounds)"
printf '%s\n' "${summary[@]}"

#!/usr/bin/env bash
# One command for the GPU proof: the GPU-marked tests, then every benchmark table, in one run.
# On the GPU machine, from the repo root:   bash tools/bench/proof_kernels.sh [OUT_DIR]
# Logs go to OUT_DIR (default $OUT when set, else ./gpu-proof-logs); tables are printed last.
set -uo pipefail
out=${1:-${OUT:-gpu-proof-logs}}
mkdir -p "$out"
# shellcheck disable=SC1091
source tools/bench/env.sh
status=0
python3 -m pytest -q -m gpu tests 2>&1 | tee "$out/gpu-tests.log" || status=1
for bench in tools/bench/deltaformer.py tools/bench/gated_delta_product.py; do
  [ -f "$bench" ] || continue
  name=$(basename "$bench" .py)
  python3 "$bench" 2>&1 | tee "$out/$name.log" || status=1
done
exit $status

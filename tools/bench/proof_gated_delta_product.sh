#!/usr/bin/env bash
# GPU proof of the Triton Gated DeltaProduct op, one call on one GPU (after `source tools/bench/env.sh`):
#   1. the `gpu`-marked tests of the op (tests/kernels/gated_delta_product/: bf16 against the fp64
#      reference, fp32 at 1e-4, the stages against their alternatives),
#   2. the benchmark table against FLA at [4,4096,16,128] and [8,2048,16,64], n_h = 2, 3, 1 (FLA autotunes
#      on a fresh machine: give the table a call of its own when the tests take most of one).
# Each step runs under `timeout`; what it printed before its limit stays in its log.
# Overrides: GDP_LIMITS="t_tests t_bench" (seconds; 0 skips a step). Logs go to ${OUT:-gpu_proof_out}/gdp_*.
set -u
export PYTHONUNBUFFERED=1  # a step killed by its timeout keeps everything it printed
out="${OUT:-gpu_proof_out}"
mkdir -p "$out"
read -r t_tests t_bench <<<"${GDP_LIMITS:-230 330}"

step() {  # step LIMIT LOG CMD...: run CMD under timeout, log everything, say how it ended (LIMIT 0: skip)
  local limit=${1:-0} log=$out/$2
  shift 2
  [ "$limit" -gt 0 ] || { echo "== skipped (limit 0): $*"; return 0; }
  echo "== $(date -u +%T) start (limit ${limit}s): $*"
  timeout -k 5 "$limit" "$@" >"$log" 2>&1
  local rc=$?
  [ "$rc" -eq 124 ] && echo "!! timed out after ${limit}s (partial output kept)" >>"$log"
  echo "== $(date -u +%T) exit $rc -> $log"
  tail -n "${TAIL:-40}" "$log"
}

nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$out/gdp_device.txt"
step "$t_tests" gdp_tests.log python3 -m pytest -q -m gpu -rA -p no:cacheprovider tests/kernels/gated_delta_product
TAIL=30 step "$t_bench" gdp_bench.md python3 tools/bench/gated_delta_product.py \
  --shapes 4x4096x16x128,8x2048x16x64 --nh 2,3,1

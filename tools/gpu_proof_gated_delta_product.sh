#!/usr/bin/env bash
# GPU proof of the Triton Gated DeltaProduct kernels, one call on one GPU (after `source tools/gpu_env.sh`):
#   1. the `gpu`-marked tests (the opt-in variants first, then the default path),
#   2. our per-stage breakdown (default and lowp; no FLA) and an ours-only table of every variant,
#   3. the table vs FLA 0.6.0 for every variant (FLA autotunes here: the slow part),
#   4. the launch-config sweep of the state passes and gradient kernels.
# Each step runs under `timeout`, so a slow one cannot eat the others; what a step printed before its
# limit stays in its log. Limits (seconds) add up to ~7.5 min; override with GDP_LIMITS="t1 t2 t3 t4".
# Logs go to ${OUT:-gpu_proof_out}/gdp_*.
set -u
export PYTHONUNBUFFERED=1  # a step killed by its timeout keeps everything it printed
out="${OUT:-gpu_proof_out}"
mkdir -p "$out"
read -r t_tests t_breakdown t_fla t_sweep <<<"${GDP_LIMITS:-140 100 160 50}"
variants="default,save_states,lowp,save_states+lowp"
bench=(python3 tools/bench_gated_delta_product.py)

step() {  # step LIMIT LOG CMD...: run CMD under timeout, log everything, say how it ended
  local limit=$1 log=$out/$2
  shift 2
  echo "== $(date -u +%T) start (limit ${limit}s): $*"
  timeout -k 10 "$limit" "$@" >"$log" 2>&1
  local rc=$?
  [ "$rc" -eq 124 ] && echo "!! timed out after ${limit}s (partial output kept)" >>"$log"
  echo "== $(date -u +%T) exit $rc -> $log"
}

nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$out/gdp_device.txt"
step "$t_tests" gdp_gpu_tests.log python3 -m pytest -q -m gpu -rA -p no:cacheprovider \
  tests/kernels/test_gated_delta_product_variants.py tests/kernels/test_gated_delta_product_triton.py
tail -n 25 "$out/gdp_gpu_tests.log"
step "$t_breakdown" gdp_breakdown.md "${bench[@]}" --no-fla --variants "$variants" \
  --breakdown 4x4096x16x128x2,4x4096x16x128x1 --shapes 4x4096x16x128 --nh 2,1
cat "$out/gdp_breakdown.md"
step "$t_fla" gdp_bench.md "${bench[@]}" --variants "$variants" --nh 2,1,3
cat "$out/gdp_bench.md"
step "$t_sweep" gdp_sweep.md "${bench[@]}" --no-table --variants default,lowp --sweep \
  --breakdown 4x4096x16x128x2
cat "$out/gdp_sweep.md"

#!/usr/bin/env bash
# GPU proof of the Triton Gated DeltaProduct kernels, one call on one GPU (after `source tools/bench/env.sh`),
# most informative first; every step under `timeout`. By default two steps, 560 s (fits a 600 s call):
#   1. the `gpu`-marked tests of the default path (test_gated_delta_product_triton.py: 15 tests, 153–159 s
#      on a warm H200; a fresh machine compiles everything first and got through 12 in 170 s),
#   2. the table of the default variant against FLA 0.6.0 at [4,4096,16,128] and [8,2048,16,64], n_h = 2, 3,
#      1. FLA autotunes: on a fresh H200 the first four rows took 350 s, so the whole table needs a call of
#      its own: GDP_LIMITS="0 560" (the whole table with two variants: 360 s on a warm H200).
# Opt-in steps (limit 0 or left out of GDP_LIMITS skips a step): 3. the variant test files, newest first
# (wyhoist, the short-loop state passes, w16 and the default's hard configurations, the K-sliced gradients, output tiles, wplanes, the series
# transform, lowp_state / bf16x3, fastwy; then *_variants.py), 4. ours only: per-stage breakdown and the
# table of our variants, 5. the launch-config sweep (each configuration in its own process: a crash cannot
# take the others).
# What a step printed before its limit stays in its log. Overrides: GDP_LIMITS="t_def t_fla t_new t_var t_brk
# t_ours t_sweep" (seconds), GDP_FLA_VARIANTS and GDP_OURS_VARIANTS (comma lists). Logs go to
# ${OUT:-gpu_proof_out}/gdp_*.
set -u
export PYTHONUNBUFFERED=1  # a step killed by its timeout keeps everything it printed
out="${OUT:-gpu_proof_out}"
mkdir -p "$out"
read -r t_def t_fla t_new t_var t_brk t_ours t_sweep <<<"${GDP_LIMITS:-230 330 0 0 0 0 0}"
# 'default' = options.DEFAULT_FLAGS; 'plain' = no flag; lowp and lowp_state are opt-in (options.py)
ours_variants="default+lowp_state,plain,default,default+lowp,default+lowp+fastwy+wywarps=2"
ours_variants="${GDP_OURS_VARIANTS:-$ours_variants}"
fla_variants="${GDP_FLA_VARIANTS:-default}"
shapes="4x4096x16x128,8x2048x16x64"
bench=(python3 tools/bench/gated_delta_product.py)
tests=(python3 -m pytest -q -m gpu -rA -p no:cacheprovider)

step() {  # step LIMIT LOG CMD...: run CMD under timeout, log everything, say how it ended (LIMIT 0: skip)
  local limit=${1:-0} log=$out/$2  # a limit GDP_LIMITS left out counts as 0
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
# 1. The default path's tests; 2. the default against FLA (GDP for every n_h, GDN for n_h = 1).
step "$t_def" gdp_tests_default.log "${tests[@]}" tests/kernels/test_gated_delta_product_triton.py
TAIL=30 step "$t_fla" gdp_bench.md "${bench[@]}" --variants "$fla_variants" --shapes "$shapes" --nh 2,3,1
# 3. Opt-in: the variants' tests (the newest first).
step "$t_new" gdp_tests_new.log "${tests[@]}" tests/kernels/test_gated_delta_product_wyhoist.py \
  tests/kernels/test_gated_delta_product_state_lean.py \
  tests/kernels/test_gated_delta_product_state_bwd_lean.py tests/kernels/test_gated_delta_product_w16.py \
  tests/kernels/test_gated_delta_product_sliced.py tests/kernels/test_gated_delta_product_output_tiles.py \
  tests/kernels/test_gated_delta_product_planes.py tests/kernels/test_gated_delta_product_series.py \
  tests/kernels/test_gated_delta_product_lowp_error.py tests/kernels/test_gated_delta_product_fast.py
step "$t_var" gdp_tests_variants.log "${tests[@]}" tests/kernels/test_gated_delta_product_variants.py
# 4. Opt-in, ours only (no FLA autotuning): stages at n_h = 2 (both shapes) and n_h = 1, every variant's table.
TAIL=80 step "$t_brk" gdp_breakdown.md "${bench[@]}" --no-table --variants "$ours_variants" \
  --breakdown 4x4096x16x128x2,8x2048x16x64x2,4x4096x16x128x1
TAIL=80 step "$t_ours" gdp_ours.md "${bench[@]}" --no-fla --variants "$ours_variants" --shapes "$shapes" \
  --nh 2,1,3
# 5. Opt-in: launch sweep on top of the default at the main shape, each entry its own process.
TAIL=40 step "$t_sweep" gdp_sweep.md "${bench[@]}" --no-table --sweep --sweep-base default \
  --sweep-timeout 40 --breakdown 4x4096x16x128x2

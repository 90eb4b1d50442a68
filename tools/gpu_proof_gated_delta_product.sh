#!/usr/bin/env bash
# GPU proof of the Triton Gated DeltaProduct kernels, one call on one GPU (after `source tools/gpu_env.sh`),
# most informative first; every step under `timeout`, limits sum to 525 s (fits a 540 s call):
#   1. the `gpu`-marked tests, one pytest run per file (a timeout names its file; no -x: all failures show);
#      the newest variants (lowp_state, bf16x3: test_gated_delta_product_lowp_error.py) first,
#   2. ours only: per-stage breakdown (lowp_state / bf16x3 first, then default / lowp ...) and the table of
#      our variants at [4,4096,16,128] and [8,2048,16,64], n_h = 2, 1, 3,
#   3. the table vs FLA 0.6.0 for the two most promising variant strings only (FLA autotunes: slow),
#   4. the launch-config sweep (each configuration in its own process: a crash cannot take the others).
# What a step printed before its limit stays in its log. Overrides: GDP_LIMITS="t1a t1b t1c t2a t2b t3 t4"
# (seconds; 1 effectively skips a step), GDP_FLA_VARIANTS and GDP_OURS_VARIANTS (comma lists). Logs go to
# ${OUT:-gpu_proof_out}/gdp_*.
set -u
export PYTHONUNBUFFERED=1  # a step killed by its timeout keeps everything it printed
out="${OUT:-gpu_proof_out}"
mkdir -p "$out"
read -r t_new t_var t_def t_brk t_ours t_fla t_sweep <<<"${GDP_LIMITS:-95 45 95 70 70 105 45}"
# 'default' = save_states; 'plain' = neither; lowp, lowp_safe, lowp_state and bf16x3 are opt-in (options.py)
ours_variants="default+lowp_state,default+lowp_state+fastwy+wywarps=2,default+bf16x3,plain,default"
ours_variants+=",default+lowp_safe,default+lowp,default+lowp+fastwy+wywarps=2"
ours_variants="${GDP_OURS_VARIANTS:-$ours_variants}"
fla_variants="${GDP_FLA_VARIANTS:-default+lowp_state+fastwy+wywarps=2,default+lowp}"
shapes="4x4096x16x128,8x2048x16x64"
bench=(python3 tools/bench_gated_delta_product.py)
tests=(python3 -m pytest -q -m gpu -rA -p no:cacheprovider)

step() {  # step LIMIT LOG CMD...: run CMD under timeout, log everything, say how it ended
  local limit=$1 log=$out/$2
  shift 2
  echo "== $(date -u +%T) start (limit ${limit}s): $*"
  timeout -k 5 "$limit" "$@" >"$log" 2>&1
  local rc=$?
  [ "$rc" -eq 124 ] && echo "!! timed out after ${limit}s (partial output kept)" >>"$log"
  echo "== $(date -u +%T) exit $rc -> $log"
  tail -n "${TAIL:-40}" "$log"
}

nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$out/gdp_device.txt"
# 1. Tests: the newest variants first (lowp_state, bf16x3, lowp_safe; then fastwy), then the older variants,
#    then the default path.
step "$t_new" gdp_tests_new.log "${tests[@]}" tests/kernels/test_gated_delta_product_lowp_error.py \
  tests/kernels/test_gated_delta_product_fast.py
step "$t_var" gdp_tests_variants.log "${tests[@]}" tests/kernels/test_gated_delta_product_variants.py
step "$t_def" gdp_tests_default.log "${tests[@]}" tests/kernels/test_gated_delta_product_triton.py
# 2. Ours only (no FLA autotuning): stages at n_h = 2 (both shapes) and n_h = 1, then every variant's table.
TAIL=80 step "$t_brk" gdp_breakdown.md "${bench[@]}" --no-table --variants "$ours_variants" \
  --breakdown 4x4096x16x128x2,8x2048x16x64x2,4x4096x16x128x1
TAIL=80 step "$t_ours" gdp_ours.md "${bench[@]}" --no-fla --variants "$ours_variants" --shapes "$shapes" \
  --nh 2,1,3
# 3. Against FLA (GDP for every n_h, GDN for n_h = 1).
TAIL=30 step "$t_fla" gdp_bench.md "${bench[@]}" --variants "$fla_variants" --shapes "$shapes" --nh 2,1,3
# 4. Launch sweep on top of lowp at the main shape, each entry its own process.
TAIL=40 step "$t_sweep" gdp_sweep.md "${bench[@]}" --no-table --sweep --sweep-base lowp \
  --sweep-timeout 40 --breakdown 4x4096x16x128x2

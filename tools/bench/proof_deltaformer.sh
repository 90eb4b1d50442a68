#!/usr/bin/env bash
# GPU proof of the DeltaFormer Triton kernels: the gpu-marked DeltaFormer tests, then the benchmark table
# (ours vs SDPA causal; FLA with DF_FLA=1) with a per-kernel profile. Run from the repository root on a
# CUDA machine:   bash tools/bench/proof_deltaformer.sh   (logs also go to $OUT when set)
# Each part runs under its own `timeout`; bench rows are printed as soon as they are measured.
#
# Switches (environment):
#   DF_TESTS=1|0        run the gpu tests (default 1); DF_TEST_TIMEOUT seconds (default 600); DF_TEST_K a
#                       pytest -k expression to select some of them
#   DF_BENCH=1|0        run the benchmark (default 1); DF_BENCH_TIMEOUT seconds per shape (default 200)
#   DF_FLA=1            add FLA's rows (its autotuning takes minutes: raise DF_BENCH_TIMEOUT)
#   DF_PROFILE=0        skip the per-kernel profile
#   DF_SHAPES           shapes to bench (default: 2x8192x32x128 8x2048x16x64)
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ -f tools/bench/env.sh ] && ! python3 -c "import titan_delta_kernels" 2>/dev/null; then
  # shellcheck disable=SC1091
  source tools/bench/env.sh
fi
log_dir="${OUT:-$(mktemp -d)}"
mkdir -p "$log_dir"
# a fresh inductor cache: a warm machine's cache can hold graphs traced against an older op schema
TORCHINDUCTOR_CACHE_DIR="$(mktemp -d)"
export TORCHINDUCTOR_CACHE_DIR
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$log_dir/gpu.txt"
start=$SECONDS

if [ "${DF_TESTS:-1}" = 1 ]; then
  select=()
  [ -n "${DF_TEST_K:-}" ] && select=(-k "$DF_TEST_K")
  echo "== gpu tests (timeout ${DF_TEST_TIMEOUT:-600}s)"
  timeout --kill-after=10 "${DF_TEST_TIMEOUT:-600}" python3 -m pytest -m gpu -q -s -rA -p no:cacheprovider \
    tests/kernels/deltaformer tests/ops/test_deltaformer_reference.py "${select[@]}" 2>&1 \
    | tee "$log_dir/gpu_tests.log" | tail -n 80
  echo "== tests: exit ${PIPESTATUS[0]} (124 = timed out) after $((SECONDS - start)) s"
fi

if [ "${DF_BENCH:-1}" = 1 ]; then
  extra=()
  [ "${DF_FLA:-0}" = 1 ] || extra+=(--no-fla)
  [ "${DF_PROFILE:-1}" = 1 ] && extra+=(--profile)
  : > "$log_dir/bench.log"
  for shape in ${DF_SHAPES:-2x8192x32x128 8x2048x16x64}; do
    echo "== bench $shape (timeout ${DF_BENCH_TIMEOUT:-200}s)"
    timeout --kill-after=10 "${DF_BENCH_TIMEOUT:-200}" python3 tools/bench/deltaformer.py --shapes "$shape" \
      "${extra[@]}" 2>&1 | grep -v "^\s*$" | tee -a "$log_dir/bench.log"
    echo "== bench $shape: exit ${PIPESTATUS[0]} (124 = timed out) after $((SECONDS - start)) s" \
      | tee -a "$log_dir/bench.log"
  done
fi
echo "== total $((SECONDS - start)) s"

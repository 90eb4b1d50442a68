#!/usr/bin/env bash
# GPU proof of the DeltaFormer Triton kernels: the gpu-marked correctness tests, then the benchmark tables
# (ours, defaults and opt-in variants, vs SDPA causal; FLA optional) with per-kernel profiles. Run from the
# repository root on a CUDA machine:   bash tools/bench/proof_deltaformer.sh   (logs also go to $OUT when set)
# Every part runs under its own `timeout`, so one slow part cannot eat the others' time; bench rows are
# printed as soon as they are measured, so a part cut short still leaves its finished rows. While the tests
# run, background processes compile every benchmarked variant (Triton's disk cache), so the timed bench
# runs alone on the GPU and spends its time measuring. Expected wall time (H200): ~7 min with the defaults,
# at most ~9 min by the timeouts (max(tests 330 s, warm-up 225 s) + 2 × bench 100 s): the quick tests took
# longer than 250 s once the wave variants joined them (2026-11-21 run 15).
#
# Switches (environment):
#   DF_TESTS=quick|full|none  quick (default): the variant tests + the main default-path tests (~3 min);
#                             full: every gpu test of both files (~5.5 min: use with DF_BENCH=0)
#   DF_TEST_TIMEOUT           seconds for the tests (default 330 quick, 400 full)
#   DF_TEST_K                 pytest -k expression replacing the quick selection
#   DF_TEST_VARIANT           variant spec the default-path tests run with (TITAN_DELTA_DF_VARIANT, tests
#                             only: the bench's '' row stays the defaults)
#   DF_BENCH=1|0              run the benchmark (default 1); DF_BENCH_TIMEOUT per shape (default 100 s)
#   DF_WARM=1|0               compile the variants in parallel first (default 1); DF_WARM_TIMEOUT: the
#                             warm-up's deadline in seconds after the start (default 220)
#   DF_FLA=1                  add FLA's rows (its autotuning takes minutes: raise DF_BENCH_TIMEOUT)
#   DF_SEPARATE_W=1           add the separate-probe row
#   DF_PROFILE=0              skip the per-kernel profiles
#   DF_PROFILE_<B>x<T>x<H>x<D>   '|' list of variant specs profiled for that shape (defaults below)
#   DF_SHAPES                 shapes to bench (default: the issue's two)
#   DF_VARIANTS_<B>x<T>x<H>x<D>  '|' list of variant specs for that shape (defaults below; '' = defaults)
# Extra arguments are passed to every bench call, e.g. --inv-prec tf32
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
date -u +"run at %Y-%m-%dT%H:%M:%SZ" | tee -a "$log_dir/gpu.txt"
start=$SECONDS

# Variant sweeps (docs/kernels_deltaformer.md). Since run 11 the defaults are the fused preparation launch
# with a wavefront solve inside each superblock (D <= 128) and the wavefront backward (D <= 64); superblock
# 256 at T = 8192 and 512 at T = 2048. The leading '' row is the defaults; `superblocks` is the run 8
# default; the rest try the neighbours of the defaults measured in runs 9-11.
export DF_VARIANTS_2x8192x32x128="${DF_VARIANTS_2x8192x32x128-|superblocks|wavesb,wtile=8:3:8:2}"
export DF_VARIANTS_8x2048x16x64="${DF_VARIANTS_8x2048x16x64-|superblocks|sb=1024|wave,wtile=4:3:4:3|\
wtile=4:2:4:3}"
export DF_PROFILE_2x8192x32x128="${DF_PROFILE_2x8192x32x128-}"
export DF_PROFILE_8x2048x16x64="${DF_PROFILE_8x2048x16x64-}"
shapes="${DF_SHAPES:-2x8192x32x128 8x2048x16x64}"
bench="${DF_BENCH:-1}"

warm_pid=""
if [ "$bench" = 1 ] && [ "${DF_WARM:-1}" = 1 ]; then
  (
    n=0
    for shape in $shapes; do
      var="DF_VARIANTS_${shape}"
      IFS='|' read -r -a specs <<< "${!var-}"
      [ "${#specs[@]}" -gt 0 ] || specs=("")
      for spec in "${specs[@]}"; do
        while [ "$(jobs -rp | wc -l)" -ge 8 ]; do wait -n; done
        n=$((n + 1))
        left=$((${DF_WARM_TIMEOUT:-220} - (SECONDS - start)))  # the whole warm-up ends by this deadline
        if [ "$left" -lt 20 ]; then
          echo "# warm-up exit 124 (not started: deadline)" > "$log_dir/warm_${shape}_${n}.log"
          continue
        fi
        (timeout --kill-after=5 "$left" python3 tools/bench/deltaformer.py --warm \
          --shapes "$shape" --variant "$spec"; echo "# warm-up exit $?") > "$log_dir/warm_${shape}_${n}.log" 2>&1 &
      done
    done
    wait
  ) &
  warm_pid=$!
  echo "== compiling the benchmarked variants in the background (pid $warm_pid)"
fi

tests="${DF_TESTS:-quick}"
test_files=(tests/kernels/test_deltaformer_triton.py tests/kernels/test_deltaformer_variants.py
            tests/kernels/test_deltaformer_wavefront.py tests/kernels/test_deltaformer_inverse.py)
case "$tests" in
  quick) select=(-k "${DF_TEST_K:-wave or split or variant or varlen or long_sequence or compile_fullgraph or (matches_fp32_reference and (1000 or 777))}")
         limit="${DF_TEST_TIMEOUT:-330}" ;;
  full) select=(); limit="${DF_TEST_TIMEOUT:-400}" ;;
  none) select=(); limit=0 ;;
  *) echo "DF_TESTS must be quick, full or none, got '$tests'" >&2; exit 2 ;;
esac
if [ "$tests" != none ]; then
  echo "== gpu tests ($tests, timeout ${limit}s)"
  TITAN_DELTA_DF_VARIANT="${DF_TEST_VARIANT:-}" timeout --kill-after=10 "$limit" python3 -m pytest -m gpu -q -s -rA -p no:cacheprovider "${test_files[@]}" \
    "${select[@]}" 2>&1 | tee "$log_dir/gpu_tests.log" | tail -n 60
  echo "== tests: exit ${PIPESTATUS[0]} (124 = timed out) after $((SECONDS - start)) s"
fi

if [ "$bench" = 1 ]; then
  if [ -n "$warm_pid" ]; then
    wait "$warm_pid"
    echo "== compiled after $((SECONDS - start)) s; warm-up failures (exit 124 = timed out):"
    grep -h -e "warm-up failed" -e "warm-up exit [1-9]" "$log_dir"/warm_*.log || echo "   none"
  fi
  extra=()
  [ "${DF_FLA:-0}" = 1 ] || extra+=(--no-fla)
  [ "${DF_SEPARATE_W:-0}" = 1 ] && extra+=(--separate-w)
  : > "$log_dir/bench.log"
  for shape in $shapes; do
    var="DF_VARIANTS_${shape}"
    profile="DF_PROFILE_${shape}"
    prof=()
    [ "${DF_PROFILE:-1}" = 1 ] && prof=(--profile --profile-variant "${!profile-}")
    echo "== bench $shape (timeout ${DF_BENCH_TIMEOUT:-100}s)"
    timeout --kill-after=10 "${DF_BENCH_TIMEOUT:-100}" python3 tools/bench/deltaformer.py --shapes "$shape" \
      --variant "${!var-}" "${extra[@]}" "${prof[@]}" "$@" 2>&1 | grep -v "^\s*$" | tee -a "$log_dir/bench.log"
    echo "== bench $shape: exit ${PIPESTATUS[0]} (124 = timed out) after $((SECONDS - start)) s" \
      | tee -a "$log_dir/bench.log"
  done
fi
echo "== total $((SECONDS - start)) s"

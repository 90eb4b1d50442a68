#!/usr/bin/env bash
# GPU proof of the DeltaFormer Triton kernels: the gpu-marked correctness tests, then the benchmark table
# (ours vs SDPA causal vs FLA, same run) with a per-kernel profile. Run from the repository root on a
# CUDA machine:   bash tools/gpu_proof_deltaformer.sh            (logs also go to $OUT when it is set)
# Extra benchmark arguments can be passed through, e.g. --superblock 512,1024 --vsplit 1,2
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -f tools/gpu_env.sh ]; then
  # shellcheck disable=SC1091
  source tools/gpu_env.sh
fi
log_dir="${OUT:-$(mktemp -d)}"
mkdir -p "$log_dir"
# a fresh inductor cache: a warm machine's cache can hold graphs traced against an older op schema
TORCHINDUCTOR_CACHE_DIR="$(mktemp -d)"
export TORCHINDUCTOR_CACHE_DIR
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$log_dir/gpu.txt"
date -u +"run at %Y-%m-%dT%H:%M:%SZ" | tee -a "$log_dir/gpu.txt"
python3 -m pytest -m gpu -q -s -rA -p no:cacheprovider tests/kernels/test_deltaformer_triton.py 2>&1 \
  | tee "$log_dir/gpu_tests.log" | tail -n 60
python3 tools/bench_deltaformer.py --separate-w --profile "$@" 2>&1 | grep -v "^\s*$" | tee "$log_dir/bench.log"

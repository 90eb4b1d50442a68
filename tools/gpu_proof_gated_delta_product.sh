#!/usr/bin/env bash
# GPU proof of the Triton Gated DeltaProduct kernels: the marked GPU tests, then the benchmark vs FLA.
# Run from the repository root on a CUDA machine (after `source tools/gpu_env.sh` where wheels are carried).
# Logs go to ${OUT:-gpu_proof_out}/.
set -u
out="${OUT:-gpu_proof_out}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/gdp_device.txt"
python3 -m pytest -q -m gpu tests/kernels/test_gated_delta_product_triton.py -rA 2>&1 | tee "$out/gdp_gpu_tests.log" | tail -40
python3 tools/bench_gated_delta_product.py --breakdown 4x4096x16x128x3 "$@" 2>&1 | tee "$out/gdp_bench.md"

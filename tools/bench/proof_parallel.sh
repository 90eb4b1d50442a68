#!/usr/bin/env bash
# Runs GPU proofs side by side on a machine with two or more GPUs, one job per GPU, so that one lease
# covers both kernel benchmarks and trainer runs. From the repository root on the GPU machine:
#
#   source tools/bench/env.sh && KERNELS="gdp deltaformer" FAMILIES="transformer deltaformer" \
#     tools/bench/proof_parallel.sh OUT_DIR
#
# GPU 0 runs the kernel proofs named in KERNELS (gdp, deltaformer, or gdp_bench: the GDP benchmark
# alone with GDP_BENCH_ARGS; each with its own time limit in seconds, GDP_LIMIT / DF_LIMIT); GPU 1 runs tools/bench/proof_trainer.sh for FAMILIES (limit
# TRAINER_LIMIT). Then, if FSDP_FAMILY is set, that family's 340M config trains under FSDP on both GPUs
# (limit FSDP_LIMIT). Each job's whole log is written to OUT_DIR as one file per job (kernels_gdp.log,
# kernels_deltaformer.log, trainer.md, trainer_tails.log), so few files need copying back; a failed
# training run's log tail is kept whole.
# The two jobs share the host's CPUs but not a GPU; kernel timings use CUDA events.
set -uo pipefail
out="${1:?usage: tools/bench/proof_parallel.sh OUT_DIR}"
mkdir -p "$out"
KERNELS="${KERNELS:-gdp deltaformer}"
FAMILIES="${FAMILIES:-}"
GDP_LIMIT="${GDP_LIMIT:-480}"
DF_LIMIT="${DF_LIMIT:-480}"
TRAINER_LIMIT="${TRAINER_LIMIT:-560}"
FSDP_FAMILY="${FSDP_FAMILY:-}"
FSDP_LIMIT="${FSDP_LIMIT:-200}"
work="$(mktemp -d)"

kernels() {
  export CUDA_VISIBLE_DEVICES=0
  for k in $KERNELS; do
    case "$k" in
      gdp) OUT="$work/gdp" timeout "$GDP_LIMIT" bash tools/bench/proof_gated_delta_product.sh \
             >"$out/kernels_gdp.log" 2>&1 ;;
      gdp_bench) timeout "$GDP_LIMIT" python3 tools/bench/gated_delta_product.py ${GDP_BENCH_ARGS:-} \
             >"$out/kernels_gdp.log" 2>&1 ;;
      deltaformer) OUT="$work/df" timeout "$DF_LIMIT" bash tools/bench/proof_deltaformer.sh \
             >"$out/kernels_deltaformer.log" 2>&1 ;;
      *) echo "unknown kernel proof '$k' (expected gdp, gdp_bench or deltaformer)" >>"$out/kernels_errors.log" ;;
    esac
  done
}

trainer() {
  [[ -n "$FAMILIES" ]] || return 0
  CUDA_VISIBLE_DEVICES="${TRAINER_GPUS:-1}" OUT="$work/trainer" FAMILIES="$FAMILIES" \
    timeout "$TRAINER_LIMIT" bash tools/bench/proof_trainer.sh >"$out/trainer.md" 2>&1
  keep_tails
}

keep_tails() {
  for log in "$work"/trainer/*/train.log; do
    [[ -f "$log" ]] || continue
    echo "=== $log" >>"$out/trainer_tails.log"
    if grep -q "exit code 0" "$log"; then
      grep -E "step:|exit code" "$log" | tail -n 25 >>"$out/trainer_tails.log"
    else
      grep -v "^\s*$" "$log" | tail -n 80 >>"$out/trainer_tails.log"
    fi
  done
  rm -f "$work"/trainer/*/train.log
}

kernels &
kpid=$!
trainer &
tpid=$!
wait "$kpid" "$tpid"
if [[ -n "$FSDP_FAMILY" ]]; then
  CUDA_VISIBLE_DEVICES=0,1 OUT="$work/trainer" FAMILIES="" MULTI_GPU=2 MULTI_FAMILY="$FSDP_FAMILY" \
    timeout "$FSDP_LIMIT" bash tools/bench/proof_trainer.sh >>"$out/trainer.md" 2>&1
  keep_tails
fi
echo "gpu_proof_parallel: done $(date -u +%FT%TZ)" | tee -a "$out/trainer.md"

#!/usr/bin/env bash
# The equal-token family comparison of docs/results.md on one GPU machine: builds the offline corpus from
# what the machine holds (unless CORPUS already has one), then trains each RUN (compare_families.py's
# family[:field=value,...]) at the 131M shape below for TOKENS tokens on GPUS_PER_RUN GPUs, with held-out
# validation every VAL_FREQ steps and the offline lm-eval tasks at the end. From the repo root:
#
#   source tools/bench/env.sh && bash tools/bench/run_comparison.sh OUT_DIR transformer deltaformer ...
#
# Environment: CORPUS (/tmp/offline_corpus), TOKENS (2e8), GPUS_PER_RUN (4), GLOBAL_BATCH (128 sequences of
# 2048), VAL_FREQ (50), SEED (0: model initialisation; the data order is the same for every seed; give each
# seed its own OUT_DIR), THREADS (12, corpus build). Runs of one OUT_DIR made by several invocations (e.g.
# on several leases) go into one table with `compare_families.py --report-only` and the same arguments.
set -uo pipefail
out="${1:?usage: tools/bench/run_comparison.sh OUT_DIR RUN [RUN ...]}"
shift
corpus="${CORPUS:-/tmp/offline_corpus}"
mkdir -p "$out"
if [ ! -f "$corpus/pretokenized/train/index.json" ]; then
  start=$(date +%s)
  python3 tools/build_offline_corpus.py --out "$corpus" --pretokenize --threads "${THREADS:-12}" \
    >"$out/corpus_build.log" 2>&1
  echo "corpus build: exit $? in $(($(date +%s) - start)) s" | tee -a "$out/corpus_build.log"
fi
cp "$corpus"/{manifest.json,SOURCES.md,EXCLUDED.md} "$out"/ 2>/dev/null
# 131M parameters (transformer, deltaformer) to 158M (gated_deltaproduct, n_h 3) on the 340M recipe:
# d 768, 15 layers, 12 attention heads of 64, 3 Gated DeltaProduct heads of key dim 128; no activation
# checkpointing (at local batch 16 on H100s: 17.8-35.9 GiB peak over the seven runs of docs/results.md,
# the most for gated_deltaproduct n_h 3).
python3 tools/bench/compare_families.py --size 340M --tokens "${TOKENS:-2e8}" \
  --global-batch "${GLOBAL_BATCH:-128}" --local-batch 16 --seed "${SEED:-0}" \
  --gpus-per-run "${GPUS_PER_RUN:-4}" \
  --warmup-steps 100 --val-freq "${VAL_FREQ:-50}" --val-steps -1 --log-freq 10 --warmup-logs 3 \
  --data "parquet:$corpus/train/*.parquet" --heldout "parquet:$corpus/heldout/*.parquet" \
  --out "$out" --runs "$@" -- --model.dim 768 --model.n_layers 15 --model.n_heads 12 \
  --model.gdp_n_heads 3 --activation_checkpoint.mode none --data.pretokenized "$corpus/pretokenized/train"

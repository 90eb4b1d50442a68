#!/usr/bin/env bash
# Train on one node with torchrun (one process per GPU; on a CPU-only machine, processes on gloo).
#
#   NGPU=8 CONFIG=train_configs/deltaformer_340M.toml launch/run_single_node.sh [--section.key value ...]
#
# Environment: NGPU (processes, default 8), CONFIG (TOML, default train_configs/debug.toml),
# LOG_RANK (comma-separated ranks whose output is shown, default 0), DRY_RUN=1 (print the command and exit).
# Extra arguments are passed to titan_delta.train as config overrides.
set -euo pipefail

NGPU="${NGPU:-8}"
CONFIG="${CONFIG:-train_configs/debug.toml}"
LOG_RANK="${LOG_RANK:-0}"

if ! [[ "$NGPU" =~ ^[1-9][0-9]*$ ]]; then
  echo "run_single_node.sh: NGPU must be a positive integer, got '$NGPU'" >&2
  exit 2
fi
if [[ ! -f "$CONFIG" ]]; then
  echo "run_single_node.sh: CONFIG file not found: '$CONFIG'" >&2
  exit 2
fi

cmd=(
  torchrun --standalone --nnodes=1 --nproc_per_node="$NGPU"
  --local-ranks-filter="$LOG_RANK" --role=rank --tee=3
  -m titan_delta.train --job.config_file "$CONFIG" "$@"
)

if [[ "${DRY_RUN:-0}" == "1" ]]; then
  echo "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True $(printf '%q ' "${cmd[@]}")"
  exit 0
fi
export PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}"
exec "${cmd[@]}"

#!/usr/bin/env bash
# Train on one node with torchrun (one process per GPU; on a CPU-only machine, processes on gloo).
#
#   NGPU=8 CONFIG=train_configs/deltaformer_340M.toml launch/run_single_node.sh [--section.key value ...]
#
# Environment: NGPU (processes, default: the GPUs visible to this shell, i.e. nvidia-smi's count limited
# by CUDA_VISIBLE_DEVICES, or 1 without a GPU), CONFIG (TOML, default train_configs/debug.toml), LOG_RANK
# (comma-separated ranks whose output is shown, default 0), DRY_RUN=1 (print the command and exit),
# PREFLIGHT=0 (skip the config check below).
# Extra arguments are passed to titan_delta.train as config overrides; -h/--help prints this text.
# Before torchrun starts, one process checks the config and every path it names
# (python -m titan_delta.train --check_only): a problem is one line and exit code 2, instead of the same
# error on every rank and torchrun's failure report.
set -euo pipefail

usage() { sed -n '2,/^[^#]/{/^[^#]/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }
for arg in "$@"; do
  if [[ "$arg" == "-h" || "$arg" == "--help" ]]; then
    usage
    exit 0
  fi
done

# GPUs this shell can see: nvidia-smi's list, cut down to the CUDA_VISIBLE_DEVICES entries when set
# (CUDA stops at the first invalid entry; an empty value or -1 hides every GPU).
visible_gpus() {
  local count=0 visible=0 id
  if command -v nvidia-smi >/dev/null 2>&1; then
    count=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
  fi
  if [[ -n "${CUDA_VISIBLE_DEVICES+set}" ]]; then
    IFS=',' read -ra ids <<<"$CUDA_VISIBLE_DEVICES"
    for id in "${ids[@]}"; do
      [[ -z "$id" || "$id" == -* ]] && break
      visible=$((visible + 1))
    done
    ((visible < count)) && count=$visible
  fi
  echo "$count"
}

if [[ -z "${NGPU:-}" ]]; then
  NGPU=$(visible_gpus)
  ((NGPU > 0)) || NGPU=1
fi
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

train_args=(--job.config_file "$CONFIG" "$@")
cmd=(
  torchrun --standalone --nnodes=1 --nproc_per_node="$NGPU"
  --local-ranks-filter="$LOG_RANK" --role=rank --tee=3
  -m titan_delta.train "${train_args[@]}"
)

if [[ "${DRY_RUN:-0}" == "1" ]]; then
  echo "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True $(printf '%q ' "${cmd[@]}")"
  exit 0
fi
if [[ "${PREFLIGHT:-1}" != "0" ]]; then
  # WORLD_SIZE lets the check refuse what needs one process (create_seed_checkpoint) with NGPU > 1.
  rc=0
  check=$(WORLD_SIZE="$NGPU" python3 -m titan_delta.train --check_only "${train_args[@]}" 2>&1) || rc=$?
  if ((rc != 0)); then
    printf '%s\n' "$check" >&2
    exit "$rc"
  fi
fi
export PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}"
exec "${cmd[@]}"

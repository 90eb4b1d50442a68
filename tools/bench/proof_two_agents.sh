#!/usr/bin/env bash
# Two torchrun agents on one 4-GPU host stand in for two nodes (node 0 = GPUs 0,1; node 1 = GPUs 2,3), as in
# docs/training.md, "Several nodes without Slurm": CONFIG with both data-parallel degrees -1 (shard inside a
# node, replicate across: HSDP 2 x 2 here) trains STEPS steps and saves, then both agents start again and
# resume to STEPS + 10. From the repo root on the GPU machine:
#
#   source tools/bench/env.sh && bash tools/bench/proof_two_agents.sh [OUT_DIR]
#
# Environment: CONFIG (train_configs/debug.toml), STEPS (20), PORT (29512). Prints one PASS/FAIL line per
# check and exits 1 if any failed; each agent's log is kept in OUT_DIR (default $OUT or outputs/two_agents).
set -uo pipefail
out="${1:-${OUT:-outputs/two_agents}}"
CONFIG="${CONFIG:-train_configs/debug.toml}"
STEPS="${STEPS:-20}"
PORT="${PORT:-29512}"
dump="$out/run"
rm -rf "$dump"
mkdir -p "$out"
status=0

launch() {  # $1 = steps, $2 = log name; both agents at one c10d rendezvous
  local pids=() node
  for node in 0 1; do
    CUDA_VISIBLE_DEVICES="$((2 * node)),$((2 * node + 1))" python3 -m torch.distributed.run \
      --nnodes=2 --nproc_per_node=2 --node_rank="$node" --rdzv-backend=c10d \
      --rdzv-endpoint="localhost:$PORT" --rdzv-id="two-agents-$2" --role=rank --tee=3 \
      -m titan_delta.train --job.config_file "$CONFIG" --job.dump_folder "$dump" \
      --parallelism.data_parallel_replicate_degree -1 --parallelism.data_parallel_shard_degree -1 \
      --training.steps "$1" --checkpoint.enable --checkpoint.interval "$STEPS" \
      --metrics.disable_color_printing >"$out/$2_node$node.log" 2>&1 &
    pids+=($!)
  done
  local rc=0
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  return "$rc"
}

check() {  # $1 = description, then the command
  local what="$1"
  shift
  if "$@"; then echo "PASS: $what"; else echo "FAIL: $what"; status=1; fi
}

echo "two agents: $CONFIG, $(python3 -c 'import torch; print(torch.cuda.device_count())') GPUs, $(date -u +%FT%TZ)"
check "first launch: both agents exit 0" launch "$STEPS" first
check "HSDP over mesh (2, 2)" grep -q "Applied HSDP over mesh (2, 2)" "$out/first_node0.log"
check "checkpoint step-$STEPS complete" test -f "$dump/checkpoint/step-$STEPS/COMPLETE.json"
check "second launch: both agents exit 0" launch "$((STEPS + 10))" second
check "resumed at step $((STEPS + 1))" grep -q "Training starts at step $((STEPS + 1))" "$out/second_node0.log"
grep -h "step:" "$out/second_node0.log" | tail -1
rm -rf "$dump"
exit "$status"

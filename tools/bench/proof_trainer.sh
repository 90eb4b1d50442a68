#!/usr/bin/env bash
# GPU proof of the trainer. From the repo root on the GPU machine:
#
#   source tools/bench/env.sh && tools/bench/proof_trainer.sh
#
# 1. Trains every 340M config for STEPS steps on one GPU with torch.compile (inductor) and the activation
#    checkpointing AC names, on the embedded corpus (the GPU machine has no network), and prints one
#    Markdown row per model: tokens/s per GPU, TFLOP/s and MFU from the models' real FLOPs, peak memory,
#    last loss. Throughput is averaged over the log lines after the first WARMUP_LOGS (compilation).
# 2. If MULTI_GPU > 1 (and that many GPUs exist): the same run of MULTI_FAMILY under FSDP on MULTI_GPU
#    GPUs, printed next to its 1-GPU row (tokens/s per GPU, scaling efficiency).
#
# 3. If PROFILE_STEP > 0: each 1-GPU run also profiles step PROFILE_STEP (torchtitan's profiler, two warm-up
#    steps before it) and $OUT/breakdown.md gets the step split by model component
#    (tools/bench/trace_breakdown.py --components); the trace itself is deleted unless KEEP_TRACES=1.
#
# Environment: STEPS (200), LOCAL_BATCH (8 sequences), SEQ_LEN (2048 tokens per sequence), FAMILIES (all five when unset; empty = none), LOG_FREQ (10),
# WARMUP_LOGS (2), AC (full; none, selective, or config = the config's own choice), MULTI_GPU (0 = skip), MULTI_FAMILY (deltaformer), PROFILE_STEP (0 = none),
# KEEP_TRACES (0), TOP_KERNELS (40: kernels listed per profiled step), TRAIN_ARGS (more trainer flags for every run, e.g.
# "--model.attn_backend sdpa"), OUT (outputs/gpu_proof_trainer). Logs of every run stay in $OUT/<run>/train.log.
set -uo pipefail

STEPS="${STEPS:-200}"
LOCAL_BATCH="${LOCAL_BATCH:-8}"
SEQ_LEN="${SEQ_LEN:-2048}"
FAMILIES="${FAMILIES-transformer deltaformer gated_deltaproduct deltaformer_swa gated_deltaproduct_swa}"
LOG_FREQ="${LOG_FREQ:-10}"
WARMUP_LOGS="${WARMUP_LOGS:-2}"
AC="${AC:-full}"
MULTI_GPU="${MULTI_GPU:-0}"
MULTI_FAMILY="${MULTI_FAMILY:-deltaformer}"
PROFILE_STEP="${PROFILE_STEP:-0}"
KEEP_TRACES="${KEEP_TRACES:-0}"
OUT="${OUT:-outputs/gpu_proof_trainer}"
mkdir -p "$OUT"
FFN_HIDDEN_340M=2816  # the 340M flavors' SwiGLU width (docs/models.md), for the component split

overrides() {  # $1 = run folder
  echo --job.dump_folder "$1" --training.steps "$STEPS" --training.local_batch_size "$LOCAL_BATCH" \
    --training.seq_len "$SEQ_LEN" \
    --training.global_batch_size -1 --lr_scheduler.warmup_steps 20 --checkpoint.no-enable \
    --compile.enable $(checkpointing) --metrics.log_freq "$LOG_FREQ" \
    --metrics.disable_color_printing --data.sources default --data.num_workers 2 ${TRAIN_ARGS:-}
}

checkpointing() {  # AC=config keeps the config's [activation_checkpoint]
  [[ "$AC" == config ]] || echo --activation_checkpoint.mode "$AC"
}

profiling() {  # $1 = number of GPUs: the profiler flags of a 1-GPU run when PROFILE_STEP is set
  if [[ "$PROFILE_STEP" -gt 0 && "$1" == 1 ]]; then
    echo --profiling.enable_profiling --profiling.profile_freq "$PROFILE_STEP" --profiling.profiler_warmup 2 \
      --profiling.profiler_active 1
  fi
}

# Appends the profiled step's component split to $OUT/breakdown.md.
record_breakdown() {  # $1 = run folder
  local trace="$1/profile_traces/iteration_${PROFILE_STEP}/rank0_trace.json" vocab
  if [[ ! -f "$trace" ]]; then
    echo "no trace at $trace" >>"$OUT/breakdown.md"
    return
  fi
  vocab="$(python3 -c 'from titan_delta.data.tokenizer import build_tokenizer; print(build_tokenizer(None).get_vocab_size())')"
  python3 tools/bench/trace_breakdown.py "$trace" --components "$FFN_HIDDEN_340M,$vocab" \
    --kernels "${TOP_KERNELS:-40}" --idle 12 >>"$OUT/breakdown.md" 2>&1
  echo >>"$OUT/breakdown.md"
  [[ "$KEEP_TRACES" == 1 ]] || rm -rf "$1/profile_traces"
}

# Averages of the metric lines after warmup (less any the profiler slowed): "tps tflops mfu mem_gib last_loss", or "FAILED".
summarize() {  # $1 = log file
  python3 - "$1" "$WARMUP_LOGS" "$PROFILE_STEP" "$LOG_FREQ" <<'PY'
import re, sys
lines = [l for l in open(sys.argv[1], errors="replace") if re.search(r"step:\s*\d+\s+loss:", l)]
profiled, freq = int(sys.argv[3]), int(sys.argv[4])
rows = []
for line in lines:
    step = int(re.search(r"step:\s*(\d+)", line)[1])
    # the intervals holding the profiler's warm-up and active steps, and the trace dump after them
    if profiled and step > profiled - 2 and step - freq <= profiled:
        continue
    m = re.search(r"loss:\s*([\d.naif]+).*memory:\s*([\d.]+)GiB.*tps:\s*([\d,]+).*tflops:\s*([\d.,]+).*mfu:\s*([\d.na]+)%", line)
    if m:
        rows.append((float(m[1]), float(m[2]), float(m[3].replace(",", "")), float(m[4].replace(",", "")), float(m[5])))
kept = rows[int(sys.argv[2]):]
if not kept:
    print("FAILED")
else:
    mean = lambda i: sum(r[i] for r in kept) / len(kept)
    print(f"{mean(2):.0f} {mean(3):.1f} {mean(4):.1f} {max(r[1] for r in rows):.1f} {rows[-1][0]:.4f}")
PY
}

run() {  # $1 = family, $2 = number of GPUs, $3 = run name
  local dir="$OUT/$3"
  mkdir -p "$dir"
  # full-shard FSDP whatever the config ships (tools/bench/scaling.py compares the strategies)
  local fsdp=(--parallelism.data_parallel_replicate_degree 1 --parallelism.data_parallel_shard_degree -1)
  # shellcheck disable=SC2046
  NGPU="$2" CONFIG="train_configs/$1_340M.toml" LOG_RANK=0 \
    launch/run_single_node.sh $(overrides "$dir") $(profiling "$2") "${fsdp[@]}" >"$dir/train.log" 2>&1
  echo "exit code $?" >>"$dir/train.log"
  [[ -z "$(profiling "$2")" ]] || record_breakdown "$dir"
  summarize "$dir/train.log"
}

echo "gpu_proof_trainer: $STEPS steps, local batch $LOCAL_BATCH x $SEQ_LEN tokens, compile + AC=$AC, $(date -u +%FT%TZ)"
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0), torch.cuda.device_count(), 'GPU(s)')"
echo
echo "| model (340M) | GPUs | tokens/s per GPU | TFLOP/s per GPU | MFU % | peak memory GiB | loss at step $STEPS |"
echo "|---|---|---|---|---|---|---|"
declare -A ONE_GPU_TPS
for family in $FAMILIES; do
  result="$(run "$family" 1 "${family}_1gpu")"
  if [[ "$result" == FAILED ]]; then
    echo "| $family | 1 | FAILED (see $OUT/${family}_1gpu/train.log) | | | | |"
    continue
  fi
  read -r tps tflops mfu mem loss <<<"$result"
  ONE_GPU_TPS[$family]="$tps"
  echo "| $family | 1 | $tps | $tflops | $mfu | $mem | $loss |"
done

if [[ "$MULTI_GPU" -gt 1 ]]; then
  available="$(python3 -c 'import torch; print(torch.cuda.device_count())')"
  if [[ "$available" -lt "$MULTI_GPU" ]]; then
    echo "MULTI_GPU=$MULTI_GPU but only $available GPU(s): skipping the FSDP run"
    exit 0
  fi
  result="$(run "$MULTI_FAMILY" "$MULTI_GPU" "${MULTI_FAMILY}_fsdp${MULTI_GPU}")"
  if [[ "$result" == FAILED ]]; then
    echo "| $MULTI_FAMILY (FSDP) | $MULTI_GPU | FAILED (see $OUT/${MULTI_FAMILY}_fsdp${MULTI_GPU}/train.log) | | | | |"
    exit 1
  fi
  read -r tps tflops mfu mem loss <<<"$result"
  echo "| $MULTI_FAMILY (FSDP) | $MULTI_GPU | $tps | $tflops | $mfu | $mem | $loss |"
  one="${ONE_GPU_TPS[$MULTI_FAMILY]:-}"
  if [[ -n "$one" ]]; then
    python3 -c "print(f'FSDP x$MULTI_GPU: {$tps / $one * 100:.1f}% of the 1-GPU tokens/s per GPU')"
  fi
fi

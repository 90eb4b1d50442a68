#!/usr/bin/env bash
# GPU proof of multi-rank checkpoints and fault recovery. From the repo root on a machine with 2+ GPUs:
#
#   source tools/bench/env.sh && bash tools/bench/proof_checkpoint.sh
#
# 1. The debug config on 2 GPUs (FSDP over 2, Triton kernels, the scheduled lm-eval at the last step),
#    a checkpoint every 5 of 12 steps, compile off: must exit 0 with complete step-5, step-10 and step-12.
# 2. The core of the fault-injection suite on 2 GPUs with bf16 parameters (NCCL): a FSDP×2 run killed at a
#    random step with a damaged newest checkpoint resumes bitwise exactly; a kill during an async save; NaN
#    on one rank; a rank killed mid-step; a save after a scheduled eval.
# Environment: PROOF_OUT (outputs/gpu_proof_checkpoint). Logs stay in $PROOF_OUT.
set -uo pipefail
PROOF_OUT="${PROOF_OUT:-outputs/gpu_proof_checkpoint}"
mkdir -p "$PROOF_OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -2

dump="$PROOF_OUT/debug_fsdp2"
rm -rf "$dump"
NGPU=2 CONFIG=train_configs/debug.toml launch/run_single_node.sh --job.dump_folder "$dump" \
  --parallelism.data_parallel_shard_degree 2 --training.steps 12 --checkpoint.enable \
  --checkpoint.interval 5 --compile.no-enable --metrics.disable_color_printing >"$dump.log" 2>&1
rc=$?
complete=$(ls "$dump"/checkpoint/step-*/COMPLETE.json 2>/dev/null | xargs -n1 dirname | xargs -n1 basename | tr '\n' ' ')
echo "debug FSDP x2, 12 steps, checkpoint every 5: exit $rc; complete: ${complete:-none}"
grep -E "step: +12 |eval at step 12" "$dump.log" | cut -c1-160

TITAN_DELTA_TEST_TRAIN_ARGS="--training.mixed_precision_param bfloat16" python3 -m pytest -q -p no:cacheprovider \
  --durations=10 -rA "tests/trainer/test_resume.py::test_kill_and_resume_matches_uninterrupted" \
  tests/trainer/test_fault_injection.py 2>&1 | tee "$PROOF_OUT/fault_tests.log" | tail -40

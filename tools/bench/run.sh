#!/usr/bin/env bash
# The one entry point of the benchmarks and GPU proofs. From the repository root:
#
#   bash tools/bench/run.sh WHAT [ARGS...]
#
# WHAT:
#   kernels         gpu-marked tests, then the DeltaFormer and Gated DeltaProduct tables (proof_kernels.sh)
#   deltaformer     DeltaFormer kernel: its gpu tests, then the table vs SDPA and FLA (proof_deltaformer.sh)
#   gdp             Gated DeltaProduct kernel: its gpu tests, then the table vs FLA (proof_gated_delta_product.sh)
#   quality         accuracy vs the float64 reference and compile time per op, head dim, dtype (kernel_quality.py)
#   trainer         the 340M models on one GPU: tokens/s, MFU, memory (proof_trainer.sh)
#   parallel        FSDP/DDP trainer runs on every GPU of the machine (proof_parallel.sh)
#   scaling         the data-parallel scaling table: 1/2/4 GPUs × strategies (scaling.py)
#   checkpoint      save, kill, resume and reshard on several GPUs (proof_checkpoint.sh)
#   state_tracking  the state-tracking suite on GPU (proof_state_tracking.sh)
#   data            data-loader throughput on the CPU (data.py)
#   jobs            one job per GPU at once (jobs.sh OUT_DIR JOB...)
# ARGS go to that script; each script's header says what it reads. On a GPU machine the carried wheels and
# this project are installed first (env.sh); the CPU-only `data` runs without that.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
what="${1:-}"
[ -n "$what" ] && shift
here=tools/bench
case "$what" in
  kernels) script=(bash "$here/proof_kernels.sh") ;;
  deltaformer) script=(bash "$here/proof_deltaformer.sh") ;;
  gdp) script=(bash "$here/proof_gated_delta_product.sh") ;;
  quality) script=(python3 "$here/kernel_quality.py") ;;
  trainer) script=(bash "$here/proof_trainer.sh") ;;
  parallel) script=(bash "$here/proof_parallel.sh") ;;
  scaling) script=(python3 "$here/scaling.py") ;;
  checkpoint) script=(bash "$here/proof_checkpoint.sh") ;;
  state_tracking) script=(bash "$here/proof_state_tracking.sh") ;;
  data) exec python3 "$here/data.py" "$@" ;;
  jobs) script=(bash "$here/jobs.sh") ;;
  -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
  *) echo "tools/bench/run.sh: unknown or missing WHAT '${what}'; expected one of kernels, deltaformer, gdp," \
       "quality, trainer, parallel, scaling, checkpoint, state_tracking, data, jobs (--help)" >&2; exit 2 ;;
esac
# shellcheck disable=SC1091
source "$here/env.sh"
exec "${script[@]}" "$@"

#!/usr/bin/env bash
# One device call, one job per GPU: job i runs on GPU i, all at once, each under its own time limit, so a
# lease of N GPUs does N proofs in the wall time of the slowest. From the repository root on the GPU machine:
#
#   source tools/bench/env.sh && LIMIT=540 bash tools/bench/jobs.sh OUT_DIR gdp deltaformer \
#     st:s3_gdp_nh1,s3_gdp_nh2+s4_gdp_nh1,s4_gdp_nh2 trainer:deltaformer,gated_deltaproduct
#
# Job kinds:
#   gdp                     tools/bench/proof_gated_delta_product.sh
#   deltaformer             tools/bench/proof_deltaformer.sh
#   trainer:FAMILY,...      tools/bench/proof_trainer.sh for those families (340M configs, one GPU)
#   st:RUN,...[+RUN,...]    tools/bench/proof_state_tracking.sh for those paper configs; '+' starts another suite
#                           on the same GPU at the same time (1-layer models leave most of a GPU idle)
#   cmd:NAME                runs `bash -c "$JOB_NAME"` (an arbitrary command, e.g. a bench invocation);
#                           files it writes under $JOB_DIR come back in the archive
# Environment: LIMIT (seconds per job, default 540; a suite's BUDGET is LIMIT - 20), and whatever the job's
# own script reads (DF_*, GDP_LIMITS, SEEDS ...), passed through.
# Output: OUT_DIR/summary.txt (each job's exit status and the last lines of its log) and OUT_DIR/jobs.tar.gz
# (everything every job wrote, one folder per job): two files, as the device tool returns at most eight.
set -uo pipefail
out="${1:?usage: tools/bench/jobs.sh OUT_DIR JOB [JOB ...]}"
shift
(( $# > 0 )) || { echo "gpu_jobs: name at least one job (gdp, deltaformer, trainer:..., st:..., cmd:...)" >&2; exit 2; }
limit="${LIMIT:-540}"
[[ $limit =~ ^[0-9]+$ ]] || { echo "gpu_jobs: LIMIT must be whole seconds, got '$limit'" >&2; exit 2; }
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if (( $# > gpus )); then
  echo "gpu_jobs: $# jobs named but this machine has $gpus GPU(s); one job per GPU" >&2
  exit 2
fi
mkdir -p "$out"
work="$(mktemp -d)"

run_job() {  # run_job INDEX SPEC: everything goes to $work/INDEX_KIND/
  local i=$1 spec=$2 kind=${2%%:*} arg=${2#*:} dir
  dir="$work/${i}_${kind}"
  mkdir -p "$dir"
  export CUDA_VISIBLE_DEVICES=$i
  case "$kind" in
    gdp) OUT="$dir" timeout -k 10 "$limit" bash tools/bench/proof_gated_delta_product.sh ;;
    deltaformer) OUT="$dir" timeout -k 10 "$limit" bash tools/bench/proof_deltaformer.sh ;;
    trainer) OUT="$dir" FAMILIES="${arg//,/ }" timeout -k 10 "$limit" bash tools/bench/proof_trainer.sh ;;
    st)
      local n=0 group
      IFS='+' read -r -a groups <<<"$arg"
      for group in "${groups[@]}"; do
        n=$((n + 1))
        RUNS="${group//,/ }" BUDGET=$((limit - 20)) timeout -k 10 "$limit" \
          bash tools/bench/proof_state_tracking.sh "$dir/suite$n" >"$dir/suite$n.out" 2>&1 &
      done
      wait
      cat "$dir"/suite*/results.md ;;
    cmd)
      local var="JOB_${arg}"
      [[ -n "${!var-}" ]] || { echo "gpu_jobs: job cmd:$arg needs the command in \$$var"; return 2; }
      JOB_DIR="$dir" timeout -k 10 "$limit" bash -c "${!var}" ;;
    *) echo "gpu_jobs: unknown job '$spec' (expected gdp, deltaformer, trainer:..., st:..., cmd:...)"; return 2 ;;
  esac
}

echo "gpu_jobs: $(date -u +%FT%TZ), $# job(s) on $gpus GPU(s), limit ${limit}s each" | tee "$out/summary.txt"
nvidia-smi topo -m >>"$out/summary.txt" 2>&1
i=0
pids=()
for spec in "$@"; do
  (run_job "$i" "$spec" >"$work/${i}_${spec%%:*}.log" 2>&1; echo "exit $?" >>"$work/${i}_${spec%%:*}.log") &
  pids+=($!)
  i=$((i + 1))
done
wait "${pids[@]}"
i=0
for spec in "$@"; do
  log="$work/${i}_${spec%%:*}.log"
  { echo; echo "=== GPU $i: $spec ($(tail -n 1 "$log"))"; tail -n 40 "$log"; } >>"$out/summary.txt"
  i=$((i + 1))
done
# Trainer runs keep their whole train.log: keep only its metric lines when it ended well.
find "$work" -name train.log -size +2M -exec sh -c 'grep -E "step:|exit code|Error|error" "$1" >"$1.short" && mv "$1.short" "$1"' _ {} \;
tar czf "$out/jobs.tar.gz" -C "$work" .
echo "gpu_jobs: done $(date -u +%FT%TZ)" | tee -a "$out/summary.txt"

#!/usr/bin/env bash
# The state-tracking suite at the papers' settings (train_configs/state_tracking/paper/) on ONE GPU, within a
# wall-clock budget, most informative runs first. Each run is bounded by `timeout`; its training stops
# cleanly at a per-seed time limit (training.time_limit_s) so that it still evaluates and reports what it
# reached (the report marks it `cut_short`). Runs whose turn comes after the budget is spent are listed as
# skipped. Nothing is estimated: every number in the output comes from a finished run.
#
# Run from the repository root after `source tools/bench/env.sh`; the caller picks the GPU
# (CUDA_VISIBLE_DEVICES):
#   BUDGET=240 bash tools/bench/proof_state_tracking.sh OUT_DIR
# Writes exactly three files into OUT_DIR: results.md (run status + tables), results.json (every report,
# schema titan_delta.state_tracking.suite/1) and log.txt (the runs' output).
#
# Environment (all optional):
#   BUDGET     wall-clock seconds for the whole suite, summary included (default 240)
#   SEEDS      comma-separated seeds per run (default 0; the paper configs list 0,1,2)
#   RUNS       config names in run order (default: swaps round/linear/Transformer, S3 n_h=1/2, S4 n_h=1/2,
#              reachability DeltaFormer/Transformer)
#   MIN_SLOT   a run is started only with at least this many seconds left (default 45)
#   OVERHEAD   seconds per run kept for start-up and the final evaluation (default 20)
#   RESERVE    seconds kept at the end for the summary (default 15)
#   DEVICE     auto | cuda | cpu (default cuda: fail rather than silently train on a CPU)
#   CONFIG_DIR where the configs live (default train_configs/state_tracking/paper)
#   EXTRA      extra --section.key=value overrides for every run (e.g. smaller batches for a CPU smoke test)
#   PYTHON     interpreter (default python3)
set -u

out=${1:?usage: BUDGET=240 bash tools/bench/proof_state_tracking.sh OUT_DIR}
budget=${BUDGET:-240}
seeds=${SEEDS:-0}
min_slot=${MIN_SLOT:-45}
overhead=${OVERHEAD:-20}
reserve=${RESERVE:-15}
device=${DEVICE:-cuda}
config_dir=${CONFIG_DIR:-train_configs/state_tracking/paper}
extra=${EXTRA:-}
python=${PYTHON:-python3}
runs=${RUNS:-"swaps5_deltaformer_round swaps5_deltaformer_linear swaps5_transformer s3_gdp_nh1 s3_gdp_nh2 \
s4_gdp_nh1 s4_gdp_nh2 reach32_deltaformer reach32_transformer"}

for pair in "BUDGET:$budget" "MIN_SLOT:$min_slot" "OVERHEAD:$overhead" "RESERVE:$reserve"; do
  name=${pair%%:*}; value=${pair#*:}
  if ! [[ $value =~ ^[0-9]+$ ]]; then
    echo "gpu_state_tracking: $name must be a whole number of seconds, got '$value'" >&2; exit 2
  fi
done
if ! [[ $seeds =~ ^[0-9]+(,[0-9]+)*$ ]]; then
  echo "gpu_state_tracking: SEEDS must be comma-separated integers such as 0,1,2, got '$seeds'" >&2; exit 2
fi
for name in $runs; do
  if [ ! -f "$config_dir/$name.toml" ]; then
    echo "gpu_state_tracking: RUNS names $name but $config_dir/$name.toml does not exist" >&2; exit 2
  fi
done

start=$(date +%s)
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
log="$out/log.txt"
: > "$log"
status="$work/status.tsv"
: > "$status"
n_seeds=$(( $(tr -cd ',' <<< "$seeds" | wc -c) + 1 ))
n_left=$(wc -w <<< "$runs")
echo "gpu_state_tracking: budget ${budget}s, seeds $seeds, device $device, runs: $runs" | tee -a "$log"

for name in $runs; do
  elapsed=$(( $(date +%s) - start ))
  left=$(( budget - elapsed - reserve ))
  if (( left < min_slot )); then
    printf '%s\t%s\tskipped\t\t\t\t\n' "$name" "$config_dir/$name.toml" >> "$status"
    echo "== $name: skipped (${left}s left, MIN_SLOT ${min_slot}s)" | tee -a "$log"
    n_left=$(( n_left - 1 ))
    continue
  fi
  slot=$(( left / n_left ))
  (( slot < min_slot )) && slot=$min_slot
  (( slot > left )) && slot=$left
  limit=$(( (slot - overhead - 5 * (n_seeds - 1)) / n_seeds ))
  (( limit < 1 )) && limit=1
  echo "== $name: ${slot}s slot, training limit ${limit}s per seed (t=${elapsed}s)" | tee -a "$log"
  t0=$(date +%s)
  # shellcheck disable=SC2086  # EXTRA holds several overrides on purpose
  timeout --kill-after=10 "$slot" "$python" tools/state_tracking.py --config "$config_dir/$name.toml" \
    --seeds "$seeds" --device "$device" --no-progress --output "$work/$name.json" \
    --training.time_limit_s="$limit" $extra >> "$log" 2>&1
  rc=$?
  seconds=$(( $(date +%s) - t0 ))
  case $rc in
    0) state=done ;;
    124|137) state=timeout ;;
    *) state=failed ;;
  esac
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$config_dir/$name.toml" "$state" "$rc" "$seconds" \
    "$limit" "$work/$name.json" >> "$status"
  echo "== $name: $state (exit $rc) after ${seconds}s" | tee -a "$log"
  n_left=$(( n_left - 1 ))
done

"$python" -m titan_delta.state_tracking.suite --status "$status" --markdown "$out/results.md" \
  --json "$out/results.json" --budget-s "$budget" 2>&1 | tee -a "$log"
echo "gpu_state_tracking: done in $(( $(date +%s) - start ))s" | tee -a "$log"
cat "$out/results.md"

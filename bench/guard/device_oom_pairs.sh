#!/bin/bash
# Real OOMs on one H200 under a memory cap, each re-run with the first fix zeropilot printed, and the guard's
# overhead (guard on against off, interleaved pairs). Usage (GPU machine, repository root), in two calls:
#   SCENARIOS=overhead,hf-long-batch PART=a bash bench/guard/device_oom_pairs.sh "$OUT"        (~320 s)
#   SCENARIOS=ds-micro-batch,ds-full-ft-optimizer,ds-save-spike,fragmentation,ds-outside-torch PART=b \
#     bash bench/guard/device_oom_pairs.sh "$OUT"                                               (~320 s)
# -> $OUT/oom_pairs-$PART.json, $OUT/oom_pairs_${PART}_runs.tar.gz, $OUT/log-$PART.txt. Both tarballs unpack
# into one folder: tar xzf OUT/oom_pairs_a_runs.tar.gz -C bench/guard/data (then _b_), tests/guard/test_oom_pairs_data.py
# reads every summary-*.json there. No SCENARIOS: all of them in one call (about 600 s).
set -u
OUT=${1:-$OUT}; mkdir -p "$OUT"
PART=${PART:-all}
source bench/guard/common.sh
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/zp_oom_pairs_ext}
LOG="$OUT/log-$PART.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee "$LOG"
python3 bench/guard/oom_pairs.py "$OUT" --budget-s "${BUDGET_S:-360}" --part "$PART" \
  ${SCENARIOS:+--only ${SCENARIOS//,/ }} 2>&1 | tee -a "$LOG"

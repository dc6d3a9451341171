#!/bin/bash
# Real OOMs on one H200 under a memory cap, each re-run with the first fix zeropilot printed, and the guard's
# overhead (guard on against off). Usage (GPU machine, repository root, about 330 s):
#   bash bench/guard/device_oom_pairs.sh "$OUT"   -> $OUT/oom_pairs.json, $OUT/oom_pairs_runs.tar.gz, $OUT/log.txt
set -u
OUT=${1:-$OUT}; mkdir -p "$OUT"
source bench/guard/common.sh
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/zp_oom_pairs_ext}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee "$OUT/log.txt"
python3 bench/guard/oom_pairs.py "$OUT" --budget-s "${BUDGET_S:-330}" 2>&1 | tee -a "$OUT/log.txt"

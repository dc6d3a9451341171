#!/bin/bash
# One device call on nvidia-h200-x2 (issue 14, fourth and fifth passes): run a spec file through run_x2.py
# (on one GPU, its world-size-1 rows only).
#   specs/call7_trace.jsonl, call10_trace.jsonl, call11_trace.jsonl  rows measured again with the caching allocator's
#       history recorded (spec key ``trace``); the traces come back as OUT/traces.tar.gz (analyze_trace.py)
#   specs/call8_x2.jsonl, call9_x2.jsonl  held-out rows whose predictions (pred_gib) were committed before the run
# Usage, repository root, wheels on PYTHONPATH: BUDGET_S=360 bash bench/plan/run_specs.sh SPECS OUT
set -u
SPECS=$1; OUT=$2; export OUT TRACE_DIR=/tmp/traces NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
mkdir -p $TRACE_DIR
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
BUDGET_S=${BUDGET_S:-360} python3 bench/plan/run_x2.py $SPECS
if [ -n "$(ls $TRACE_DIR)" ]; then tar czf $OUT/traces.tar.gz -C $TRACE_DIR .; fi
ls -la $OUT

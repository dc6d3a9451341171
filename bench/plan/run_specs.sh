#!/bin/bash
# One device call on nvidia-h200-x2 (or nvidia-h200: its world-size-1 specs only): run a spec file through run_x2.py.
# Specs with ``trace`` record the caching allocator's history; those traces come back as OUT/traces.tar.gz (unpack
# into data/traces/, read with analyze_trace.py). The specs of rows already measured:
#   python bench/plan/rows.py specs h200x2_call21 > SPECS      (one line per spec, as zero_mem_probe_plan.py takes it)
# then, here: python bench/plan/rows.py add h200x2_callN OUT/probe.jsonl && python bench/plan/accuracy.py
# Usage, repository root, wheels on PYTHONPATH: BUDGET_S=360 bash bench/plan/run_specs.sh SPECS OUT
set -u
SPECS=$1; OUT=$2; export OUT TRACE_DIR=/tmp/traces NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
mkdir -p $TRACE_DIR
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
BUDGET_S=${BUDGET_S:-360} python3 bench/plan/run_x2.py $SPECS
if [ -n "$(ls $TRACE_DIR)" ]; then tar czf $OUT/traces.tar.gz -C $TRACE_DIR .; fi
ls -la $OUT

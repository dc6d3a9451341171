#!/bin/bash
# Device call 7 (issue 14, third pass): the caching allocator's history of the rows the plan misses most, and of
# rows it gets right, to find where the reserved-but-unallocated memory comes from (analyze_trace.py).
# Usage, repository root on nvidia-h200-x2, wheels on PYTHONPATH: bash bench/plan/run_trace_call7.sh OUT
set -u
OUT=$1; export OUT TRACE_DIR=/tmp/traces NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
mkdir -p $TRACE_DIR
BUDGET_S=${BUDGET_S:-330} python3 bench/plan/run_x2.py bench/plan/specs/call7_trace.jsonl
tar czf $OUT/traces.tar.gz -C $TRACE_DIR .
ls -la $OUT $TRACE_DIR

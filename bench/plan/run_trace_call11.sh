#!/bin/bash
# Device call 11 (issue 14, fifth pass): the caching allocator's history of the rows calls 8 and 9 missed most
# (ZeRO-1/2 with offload_optimizer) again, with each event's CUDA stream.
# Usage, repository root on nvidia-h200-x2, wheels on PYTHONPATH: bash bench/plan/run_trace_call11.sh OUT
set -u
OUT=$1; export OUT TRACE_DIR=/tmp/traces NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
mkdir -p $TRACE_DIR
BUDGET_S=${BUDGET_S:-330} python3 bench/plan/run_x2.py bench/plan/specs/call11_trace.jsonl
tar czf $OUT/traces.tar.gz -C $TRACE_DIR .
ls -la $OUT $TRACE_DIR

#!/bin/bash
# Issue 40, GPU call 6 (one H100): the two expandable_segments rows call 5 measured furthest from pred_gib
# (x_q15_mts_z2_mb2 +6.9%, x_q3_freeze4_z3_gc -6.9%) again with their allocator histories (split trace, for the next
# pass's analysis: analyze_trace.py), then the seven expandable rows of data/next/expandable_specs.jsonl that call 5
# did not reach, pred_gib committed before (memory_matrix.py), as far as the budget goes.
# usage (repository root on the GPU machine, .whl/ carried): bash bench/plan/time/device_call6.sh OUT  (~7 min)
OUT=${1:?usage: device_call6.sh OUT}
here=$(dirname "$0")
start=$(date +%s)
mkdir -p "$OUT"
export TORCH_EXTENSIONS_DIR=/tmp/zp_torch_extensions TRACE_DIR=/tmp/zp_traces NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
mkdir -p "$TRACE_DIR"
CALL_S=${CALL_S:-400} TIME_BUDGET_S=${TIME_BUDGET_S:-330} bash "$here/device.sh" "$OUT" "$here/data/call6/specs.jsonl"
tar czf "$OUT/traces.tar.gz" -C "$TRACE_DIR" .
echo "call6 $(( $(date +%s) - start ))s" >> "$OUT/log.txt"

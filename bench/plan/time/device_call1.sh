#!/bin/bash
# Issue 40, GPU call 1 (one H100 or H200): `zeropilot calibrate` (the card's speed figures: device_calibrate.sh), then
# the fit rows of data/call1/specs.jsonl one at a time (device.sh, run_rows.py), the three allocator histories after
# them as the budget allows.
# usage (repository root on the GPU machine, .whl/ carried): bash bench/plan/time/device_call1.sh OUT   (~9.5 min)
# leaves 8 files: profile.json (calibrate's), cal.tar.gz (its text, stderr, the machine), rows.jsonl, fail.log,
# machine.json, log.txt, logs.tar.gz (device.sh's), traces.tar.gz (the allocator histories)
OUT=${1:?usage: device_call1.sh OUT}
here=$(dirname "$0")
start=$(date +%s)
mkdir -p "$OUT"
export TORCH_EXTENSIONS_DIR=/tmp/zp_torch_extensions TRACE_DIR=/tmp/zp_traces NCCL_NVLS_ENABLE=0
mkdir -p "$TRACE_DIR"
bash "$here/device_calibrate.sh" /tmp/zp_cal
cp /tmp/zp_cal/profile.json "$OUT/profile.json" 2>/dev/null
tar czf "$OUT/cal.tar.gz" -C /tmp zp_cal
left=$(( 585 - ($(date +%s) - start) ))
CALL_S=$left TIME_BUDGET_S=$(( left - 60 )) bash "$here/device.sh" "$OUT" "$here/data/call1/specs.jsonl"
tar czf "$OUT/traces.tar.gz" -C "$TRACE_DIR" .
echo "call1 $(( $(date +%s) - start ))s" >> "$OUT/log.txt"

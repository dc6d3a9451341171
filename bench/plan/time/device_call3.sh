#!/bin/bash
# Issue 40, GPU call 3 (one H100; prepared in the session of calls 1 and 2, for the next one): `zeropilot calibrate`
# first, so that the host figures (eager launch, CPU Adam) are those of the machine the rows run on, then the rows of
# data/call3/specs.jsonl: six held-out rows new to the model and call 2's five host-bound rows again. Their predictions
# are committed twice before the run: with call 1's profile (pred_step_s in each spec) and as a procedure, the model
# as committed with this call's profile: python bench/plan/time/fit.py data/call3/rows.jsonl data/call3/profile.json
# --split holdout (the model and its constants may not change between this script's commit and that comparison).
# usage (repository root on the GPU machine, .whl/ carried): bash bench/plan/time/device_call3.sh OUT   (~9.5 min)
OUT=${1:?usage: device_call3.sh OUT}
here=$(dirname "$0")
start=$(date +%s)
mkdir -p "$OUT"
export TORCH_EXTENSIONS_DIR=/tmp/zp_torch_extensions NCCL_NVLS_ENABLE=0
bash "$here/device_calibrate.sh" /tmp/zp_cal
cp /tmp/zp_cal/profile.json "$OUT/profile.json" 2>/dev/null
tar czf "$OUT/cal.tar.gz" -C /tmp zp_cal
left=$(( 585 - ($(date +%s) - start) ))
CALL_S=$left TIME_BUDGET_S=$(( left - 60 )) bash "$here/device.sh" "$OUT" "$here/data/call3/specs.jsonl"
echo "call3 $(( $(date +%s) - start ))s" >> "$OUT/log.txt"

#!/bin/bash
# One H200 call for issues 34 and 35 (2026-12-03, second session): the `run --heal` OOM run, then call 3's three
# pre-registered rows that call 3 left out for device time (l8_f16, q7_f4_z3, l8_mts_z3_fp32: their predictions are
# the committed data/call3/predictions.jsonl) and two diagnostic rows (data/call3_trace/specs.jsonl: the held-out
# rows l8_f2 and q7_f2 again, now with their allocator histories, to find why the plan over-predicts them; they do not
# count as held-out rows a second time).
# usage (repo root on the GPU machine, .whl/ carried): bash bench/plan/settings/device_call4.sh DIR   (at most 9.5 min)
# writes DIR/heal/ (bench/heal/gpu_oom.sh's outputs), DIR/plan/ (probe.jsonl, fail.log, versions.json,
# traces.tar.gz), DIR/plan.log.
R=${1:?usage: device_call4.sh DIR}
start=$(date +%s)
mkdir -p "$R/heal" "$R/plan"
if ! python3 -c "import deepspeed" 2>/dev/null; then
  [ -d /tmp/site/deepspeed ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl > "$R/wheels.log" 2>&1
  export PYTHONPATH=/tmp/site
fi
OUT=$R/heal bash bench/heal/gpu_oom.sh
here=bench/plan/settings
specs=/tmp/zp_call4_specs.jsonl
grep -E '"row": "(l8_f16|q7_f4_z3|l8_mts_z3_fp32)"' "$here/data/call3/specs.jsonl" > "$specs"
cat "$here/data/call3_trace/specs.jsonl" >> "$specs"
left=$(( ${BUDGET_TOTAL_S:-560} - ($(date +%s) - start) ))
echo "rows: budget ${left}s" > "$R/plan.log"
# device.sh with this call's rows: the same probe, versions file and trace packing as calls 2 and 3
OUT=$R/plan SPECS=$specs BUDGET_S=$left POOL_GIB=${POOL_GIB:-132} bash "$here/device.sh" >> "$R/plan.log" 2>&1
echo "call: $(( $(date +%s) - start ))s" >> "$R/plan.log"

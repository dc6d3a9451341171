#!/bin/bash
# Issue 40, GPU call 5 (one H100): the host's own figures first (host_figures.py), then data/call5/specs.jsonl: six
# held-out time rows new to the model (HOLDOUT5 in matrix.py), then five rows of data/next/expandable_specs.jsonl
# (freeze tuning and modules_to_save under expandable_segments, pred_gib committed with memory_matrix.py) as far as
# the budget goes. Compared, committed before the run: pred_step_s (call 4's host figures, data/call4/
# profile_host.json) and the procedure python bench/plan/time/host_predict.py bench/plan/time/data/call5 (this
# call's host figures); the memory rows' peaks against pred_gib.
# usage (repository root on the GPU machine, .whl/ carried): bash bench/plan/time/device_call5.sh OUT   (~9.5 min)
OUT=${1:?usage: device_call5.sh OUT}
here=$(dirname "$0")
start=$(date +%s)
mkdir -p "$OUT"
export TORCH_EXTENSIONS_DIR=/tmp/zp_torch_extensions NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  > "$OUT/host.log" 2>&1
PYTHONPATH=/tmp/site timeout 200 python3 "$here/host_figures.py" "$OUT/host_figures.json" >> "$OUT/host.log" 2>&1
echo "host figures rc $? $(( $(date +%s) - start ))s" >> "$OUT/host.log"
left=$(( 585 - ($(date +%s) - start) ))
CALL_S=$left TIME_BUDGET_S=$(( left - 60 )) bash "$here/device.sh" "$OUT" "$here/data/call5/specs.jsonl"
echo "call5 $(( $(date +%s) - start ))s" >> "$OUT/log.txt"

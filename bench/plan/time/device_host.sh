#!/bin/bash
# Issue 40's held-out timing calls on one GPU (calls 4, 5 and 7): the host's own figures first (host_figures.py:
# CPUAdam and torch's AdamW at partitions of 2^24, 2^26 and 2^28 elements, the host's memory bandwidth, the eager
# launch, the CPU), then the rows of SPECS (device.sh, in the command's time left). Compared, committed before a call:
# pred_step_s in each spec (an earlier call's host) and the procedure, the model as committed with this call's host
# figures: python bench/plan/time/host_predict.py bench/plan/time/data/call<N> (OUT's files copied there).
# usage (repository root on the GPU machine, .whl/ carried): bash bench/plan/time/device_host.sh OUT SPECS  (~9.5 min)
#   call 4: data/call4/specs.jsonl; call 5: data/call5/specs.jsonl; call 7: data/call7/specs.jsonl;
#   call 9 (prepared): data/call9/specs.jsonl
OUT=${1:?usage: device_host.sh OUT SPECS}
SPECS=${2:?usage: device_host.sh OUT SPECS}
here=$(dirname "$0")
start=$(date +%s)
mkdir -p "$OUT"
export TORCH_EXTENSIONS_DIR=/tmp/zp_torch_extensions NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  > "$OUT/host.log" 2>&1
PYTHONPATH=/tmp/site timeout 200 python3 "$here/host_figures.py" "$OUT/host_figures.json" >> "$OUT/host.log" 2>&1
echo "host figures rc $? $(( $(date +%s) - start ))s" >> "$OUT/host.log"
left=$(( 585 - ($(date +%s) - start) ))
CALL_S=$left TIME_BUDGET_S=$(( left - 60 )) bash "$here/device.sh" "$OUT" "$SPECS"
echo "device_host $(( $(date +%s) - start ))s" >> "$OUT/log.txt"

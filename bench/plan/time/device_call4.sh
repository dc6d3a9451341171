#!/bin/bash
# Issue 40, GPU call 4 (one H100): the host's own figures first (host_figures.py: CPUAdam and torch's AdamW at
# partitions of 2^24, 2^26 and 2^28 elements, the host's memory bandwidth, the eager launch, the CPU), then six rows
# again (data/call4/specs.jsonl): call 2's four host-bound rows that call 3's budget left and call 3's two offload
# rows. What is compared, committed before the run: (a) pred_step_s in each spec (call 1's profile); (b) the
# procedure: the model as committed, with call 3's profile whose host figures (launch_s, launch_issue_s,
# cpu_adam_elems_per_s, torch_cpu_adamw_elems_per_s) are replaced by this call's (host_figures.json; CPUAdam's and
# AdamW's at 2^28 elements, the partition size nearest the rows'): python bench/plan/time/host_predict.py
# usage (repository root on the GPU machine, .whl/ carried): bash bench/plan/time/device_call4.sh OUT   (~9 min)
OUT=${1:?usage: device_call4.sh OUT}
here=$(dirname "$0")
start=$(date +%s)
mkdir -p "$OUT"
export TORCH_EXTENSIONS_DIR=/tmp/zp_torch_extensions NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  > "$OUT/host.log" 2>&1
PYTHONPATH=/tmp/site timeout 200 python3 "$here/host_figures.py" "$OUT/host_figures.json" >> "$OUT/host.log" 2>&1
echo "host figures rc $? $(( $(date +%s) - start ))s" >> "$OUT/host.log"
left=$(( 585 - ($(date +%s) - start) ))
CALL_S=$left TIME_BUDGET_S=$(( left - 60 )) bash "$here/device.sh" "$OUT" "$here/data/call4/specs.jsonl"
echo "call4 $(( $(date +%s) - start ))s" >> "$OUT/log.txt"

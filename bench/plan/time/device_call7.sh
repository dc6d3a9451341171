#!/bin/bash
# Issue 40, GPU call 7 (one H100): the host's own figures first (host_figures.py), then data/call7/specs.jsonl: seven
# held-out time rows new to the model (HOLDOUT7 in matrix.py: Qwen3-8B LoRA ZeRO-3, Qwen2.5-1.5B full ZeRO-1 with
# accumulation 4, Qwen2.5-3B full ZeRO-3 without checkpointing, micro batch 1 x 4096, Qwen2.5-0.5B LoRA ZeRO-3 with
# checkpointing, Llama-3.2-3B with both offloads, Qwen2.5-7B LoRA with CPUAdam). Compared, committed before the run:
# pred_step_s (call 5's host figures, data/call5/profile_host.json) and the procedure python
# bench/plan/time/host_predict.py bench/plan/time/data/call7 (this call's host figures).
# usage (repository root on the GPU machine, .whl/ carried): bash bench/plan/time/device_call7.sh OUT   (~9.5 min)
OUT=${1:?usage: device_call7.sh OUT}
here=$(dirname "$0")
start=$(date +%s)
mkdir -p "$OUT"
export TORCH_EXTENSIONS_DIR=/tmp/zp_torch_extensions NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  > "$OUT/host.log" 2>&1
PYTHONPATH=/tmp/site timeout 200 python3 "$here/host_figures.py" "$OUT/host_figures.json" >> "$OUT/host.log" 2>&1
echo "host figures rc $? $(( $(date +%s) - start ))s" >> "$OUT/host.log"
left=$(( 585 - ($(date +%s) - start) ))
CALL_S=$left TIME_BUDGET_S=$(( left - 60 )) bash "$here/device.sh" "$OUT" "$here/data/call7/specs.jsonl"
echo "call7 $(( $(date +%s) - start ))s" >> "$OUT/log.txt"

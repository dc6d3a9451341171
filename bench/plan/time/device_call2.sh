#!/bin/bash
# Issue 40, GPU call 2 (one H100; an H200 has its own committed predictions): the held-out rows and the held-out
# search's candidates of data/call2/specs.jsonl (predictions written before the run), then DeepSpeed's autotuner on the
# search's case (Qwen2.5-1.5B full fine-tuning, 16 samples of 1024 tokens per step, ZeRO-1/2, micro batch 4 or 8) with
# its wall time.
# usage (repository root on the GPU machine, .whl/ carried): bash bench/plan/time/device_call2.sh OUT   (~9.3 min)
here=$(dirname "$0")
model=$(cd "$here" && python3 -c "import json; from matrix import MODELS; print(json.dumps(MODELS['qwen2.5-1.5b']))")
TORCH_EXTENSIONS_DIR=/tmp/zp_torch_extensions CALL_S=560 TIME_BUDGET_S=330 AUTOTUNE_MODEL="$model" \
  AUTOTUNE_WALL_S=190 AUTOTUNE_ARGS="--global-batch 16 --seq 1024 --micro-batches 4,8 --stages 1,2" \
  bash "$here/device.sh" "${1:?usage: device_call2.sh OUT}" "$here/data/call2/specs.jsonl"

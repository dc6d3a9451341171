#!/usr/bin/env bash
# `zeropilot run --heal` on one H200: a real OOM under a memory cap healed by the fix zeropilot ranks first.
# Usage (GPU machine, repository root): OUT=DIR bash bench/heal/gpu_oom.sh          (about 5 minutes, at most 8)
# DeepSpeed and pydantic travel as wheels in .whl/ (installed into /tmp/site when the image lacks DeepSpeed).
#
# 1. reference: gpu_train.py (HF Trainer, ZeRO-2, Qwen2-0.5B shape, bf16) uncapped, micro batch 4 x accumulation 4,
#    12 steps, samples of 1024 tokens for steps 1-4 and 1536 from step 5 (in order), saves every 4 steps;
# 2. the cap: halfway between the reference's peak allocated memory over steps 1-4 and over all steps (gpu_compare.py
#    cap): micro batch 4 fits at 1024 tokens and not at 1536;
# 3. the same command under `zeropilot run --heal` with CAP_BYTES set: attempt 1 runs out of memory at step 5, the
#    heal applies the first ranked fix that keeps the training the same and resumes from checkpoint-4;
# 4. gpu_compare.py: the losses of the steps after the resume against the reference's (same samples per step).
# Back in $OUT: results-gpu-oom.json (the figures), report.txt (zeropilot report of the heal run), heal.json,
# runs.tar.gz (both run directories, no checkpoints), log.txt.
set -uo pipefail
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
LOG="$OUT/log.txt"
source bench/guard/common.sh  # the wheels of .whl/ where the image lacks DeepSpeed, then the environment
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/zp_heal_ext} PYTHONUNBUFFERED=1
W=${WORK:-/tmp/zp-heal-gpu}
rm -rf "$W"; mkdir -p "$W"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >> "$LOG" 2>&1
python3 -c "import torch, deepspeed, transformers; print(torch.__version__, deepspeed.__version__, transformers.__version__)" >> "$LOG" 2>&1
ARGS="--deepspeed bench/heal/ds_zero2.json --per_device_train_batch_size 4 --gradient_accumulation_steps 4"
ARGS="$ARGS --gradient_checkpointing false --steps 12 --save-steps 4"
t0=$(date +%s)
timeout 180 python3 -m zeropilot run --no-check --out "$W/reference" -- \
  torchrun --nproc_per_node 1 --master_port "$(port)" bench/heal/gpu_train.py "$W/ref-ckpt" $ARGS >> "$LOG" 2>&1
echo "reference: exit $? after $(( $(date +%s) - t0 )) s" >> "$LOG"
CAP=$(python3 bench/heal/gpu_compare.py cap "$W/reference" 2>> "$LOG")
echo "cap: $CAP bytes" >> "$LOG"
t1=$(date +%s)
CAP_BYTES=$CAP timeout 240 python3 -m zeropilot run --no-check --heal --heal-backoff 2 --out "$W/healed" -- \
  torchrun --nproc_per_node 1 --master_port "$(port)" bench/heal/gpu_train.py "$W/heal-ckpt" $ARGS \
  > "$OUT/report.txt" 2>> "$LOG"
echo "healed: exit $? after $(( $(date +%s) - t1 )) s" >> "$LOG"
python3 bench/heal/gpu_compare.py compare "$W" "$CAP" > "$OUT/results-gpu-oom.json" 2>> "$LOG"
cp "$W/healed/heal.json" "$OUT/" 2>> "$LOG"
tar czf "$OUT/runs.tar.gz" -C "$W" reference healed 2>> "$LOG"
rm -rf "$W/ref-ckpt" "$W/heal-ckpt"
echo "done after $(( $(date +%s) - t0 )) s" >> "$LOG"

#!/usr/bin/env bash
# The report's step time on one GPU: a short real job under `zeropilot run`, then `zeropilot report` of it (text,
# JSON, HTML) with the measured split beside the plan's prediction for the launch.
# Usage (GPU machine, repository root): bash bench/report/device_time.sh OUT          (about 1-2 minutes)
#
# The job: examples/raw-deepspeed/train.py (a raw DeepSpeed loop, no explicit synchronisation, so the phases are
# DeepSpeed's own), Qwen2.5-0.5B's shape from its config (random weights and tokens), bf16, ZeRO-2, micro batch 4 x
# accumulation 2 of 2048 tokens, gradient checkpointing on (the search can then name a faster configuration that
# fits), 12 optimizer steps, a save at step 6 (held by step 7, left out of the medians) and one at the end.
# Override with SIZE, SEQ, STEPS, DS_CONFIG; HARDWARE=FILE passes a `zeropilot calibrate` profile to the report
# (default: the profile found for the card, else the card table).
# DeepSpeed and pydantic travel as wheels in .whl/ (installed into /tmp/site when the image lacks DeepSpeed).
# Back in OUT: report.txt, report.json, report.html, run.tar.gz (the run directory, no checkpoint), log.txt.
set -uo pipefail
OUT=${1:?usage: bash bench/report/device_time.sh OUT}
mkdir -p "$OUT"
LOG="$OUT/log.txt"
source bench/guard/common.sh  # the wheels of .whl/ where the image lacks DeepSpeed, then the environment
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/zp_time_ext} PYTHONUNBUFFERED=1
W=${WORK:-/tmp/zp-time}
rm -rf "$W"; mkdir -p "$W"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >> "$LOG" 2>&1
python3 -c "import torch, deepspeed, transformers; print(torch.__version__, deepspeed.__version__, transformers.__version__)" >> "$LOG" 2>&1
t0=$(date +%s)
timeout "${JOB_TIMEOUT:-240}" $ZP --out "$W/run" -- torchrun --nproc_per_node 1 --master_port "$(port)" \
  examples/raw-deepspeed/train.py --deepspeed_config "${DS_CONFIG:-bench/report/ds_time.json}" \
  --size "${SIZE:-qwen0.5b}" --seq "${SEQ:-2048}" --gradient-checkpointing --steps "${STEPS:-12}" --save-every 6 \
  --save-dir "$W/ckpt" >> "$LOG" 2>&1
echo "job: exit $? after $(( $(date +%s) - t0 )) s" >> "$LOG"
rm -rf "$W/ckpt"
HW=()
[ -n "${HARDWARE:-}" ] && HW=(--hardware "$HARDWARE")
python3 -m zeropilot report "$W/run" ${HW[@]+"${HW[@]}"} > "$OUT/report.txt" 2>> "$LOG"
python3 -m zeropilot report "$W/run" ${HW[@]+"${HW[@]}"} --format json --out "$OUT/report.json" 2>> "$LOG"
python3 -m zeropilot report "$W/run" ${HW[@]+"${HW[@]}"} --format html --out "$OUT/report.html" 2>> "$LOG"
tar czf "$OUT/run.tar.gz" -C "$W" run 2>> "$LOG"
echo "done after $(( $(date +%s) - t0 )) s" >> "$LOG"
sed -n '1,/^rank /p' "$OUT/report.txt"

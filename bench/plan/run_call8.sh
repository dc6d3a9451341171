#!/bin/bash
# Device call 8 (issue 14, fourth pass): the held-out rows of specs/call8_x2.jsonl, whose predictions were written
# into the specs (pred_gib) and committed before this ran. Also traces one row again (the LoRA ZeRO-3 case).
# Usage, repository root on nvidia-h200-x2, wheels on PYTHONPATH: bash bench/plan/run_call8.sh OUT
set -u
OUT=$1; export OUT NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
BUDGET_S=${BUDGET_S:-360} python3 bench/plan/run_x2.py bench/plan/specs/call8_x2.jsonl
ls -la $OUT

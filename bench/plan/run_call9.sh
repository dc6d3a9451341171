#!/bin/bash
# Device call 9 (issue 14, fifth pass): the held-out rows of specs/call9_x2.jsonl, whose predictions (pred_gib) were
# written and committed before this ran, after the ZeRO-1/2 allocator replay (memory/segments.py).
# Usage, repository root on nvidia-h200-x2, wheels on PYTHONPATH: bash bench/plan/run_call9.sh OUT
set -u
OUT=$1; export OUT NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
BUDGET_S=${BUDGET_S:-360} python3 bench/plan/run_x2.py bench/plan/specs/call9_x2.jsonl
ls -la $OUT

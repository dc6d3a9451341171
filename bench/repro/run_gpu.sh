#!/bin/bash
# The seed's shape on the GPU machine (2 x H200) under an emulated 16 GiB card, then a resume check on GPU.
# Run from the repository root; results go to $OUT (ws1.json, ws2.json, resume.json, tables.txt, log.txt).
#   MODE=cpu bash bench/repro/run_gpu.sh   the dry run on CPU (shrunk model, same code paths but CUDA)
set -o pipefail
OUT=${OUT:-/tmp/repro-out}; R=/tmp/repro-runs; mkdir -p "$OUT" "$R"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
if [ "$MODE" = cpu ]; then DEV="--cpu"; MODEL=""; else DEV="--gpu-mem-cap 16GiB"; MODEL="--model qwen2-7b"; fi
seed() {  # NAME NPROC TIMEOUT: train 3 steps, save after step 2, one step after the save; no resume
  timeout "$3" python -m zeropilot repro examples/seed $MODEL --nproc "$2" $DEV --steps 3 --save-every 2 \
    --grad-accum 2 --no-resume --format json --timeout "$3" --out "$R/$1" > "$OUT/$1.json" 2> "$R/$1.err"
  echo "== $1: exit $?"; tail -3 "$R/$1.err"
  python - "$OUT/$1.json" <<'PY'
import json, sys
from zeropilot.repro.render import render
try:
    print(render(json.load(open(sys.argv[1]))))
except Exception as exc:
    print("no verdict:", exc)
PY
  for f in "$R/$1"/leg1-rank-*.log; do echo "-- $f"; grep -v Warning "$f" | grep -iE "error|out of memory" | head -3; done
}
nvidia-smi --query-gpu=name,memory.total --format=csv 2>/dev/null
seed ws1 1 110
seed ws2 2 140
python -m zeropilot report "$R/ws2" 2>&1 | head -30
echo "== resume on GPU (qwen2.5-0.5b shape, 2 ranks)"
timeout 120 python bench/repro/gpu_resume.py "$OUT/resume.json" "$R/resume" $DEV 2>&1 | grep -v Warning | tail -40

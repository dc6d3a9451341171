#!/bin/bash
# Issue 26 on one H200: the plan's pre-registered settings rows of one call (data/$CALL/specs.jsonl, written by
# specs.py with their predictions in data/$CALL/predictions.jsonl; CALL defaults to call2, specs.py's CALL),
# measured with ../zero_mem_probe_plan.py up to four at a time (run.py).
# Needs torch, transformers, peft, accelerate, DeepSpeed, bitsandbytes (QLoRA, 8-bit AdamW) and liger_kernel (Liger);
# a row whose package is missing fails alone, into $OUT/fail.log.
# usage (repo root on the GPU machine): OUT=/some/dir bash bench/plan/settings/device.sh      (about 4 minutes)
# writes $OUT/probe.jsonl (one row per setting), $OUT/fail.log, $OUT/versions.json; then, here:
#   copy probe.jsonl into data/$CALL/ as h200.jsonl (fail.log as h200_fail.log, versions.json as h200_versions.json),
#   then python bench/plan/settings/compare.py $CALL
here=$(dirname "$0")
export PYTHONUNBUFFERED=1 DS_ACCELERATOR=cuda PROBE_CKPT=${PROBE_CKPT:-/tmp/zp_settings_ckpt}
start=$(date +%s)
python3 - > "$OUT/versions.json" <<'PY'
import importlib, json
out = {}
for m in ("torch", "transformers", "peft", "accelerate", "deepspeed", "bitsandbytes", "liger_kernel", "pynvml"):
    try:
        out[m] = getattr(importlib.import_module(m), "__version__", "present")
    except Exception as e:
        out[m] = f"missing: {type(e).__name__}: {e}"[:200]
print(json.dumps(out))
PY
cat "$OUT/versions.json"
CALL=${CALL:-call2}
specs="$here/data/$CALL/specs.jsonl"
model=$(python3 -c 'import json,sys; print(json.dumps(json.loads(open(sys.argv[1]).readline())["model"]))' "$specs")
[ -f "$PROBE_CKPT/config.json" ] || python3 "$here/../zero_mem_probe_plan.py" --save-random "$model" "$PROBE_CKPT" \
  || echo "random checkpoint not written: the quant rows will fail" >> "$OUT/fail.log"
echo "checkpoint ready $(( $(date +%s) - start ))s"
BUDGET_S=${BUDGET_S:-250} python3 "$here/run.py" "$specs"
echo "elapsed $(( $(date +%s) - start ))s"

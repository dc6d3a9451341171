#!/bin/bash
# Issue 26 on one H200: the plan's pre-registered settings rows of one call (data/$CALL/specs.jsonl, written by
# specs.py with their predictions in data/$CALL/predictions.jsonl; CALL defaults to call2, specs.py's CALL),
# measured with ../zero_mem_probe_plan.py up to four at a time (run.py).
# Needs torch, transformers, peft, accelerate, DeepSpeed, bitsandbytes (QLoRA, 8-bit AdamW) and liger_kernel (Liger);
# a row whose package is missing fails alone, into $OUT/fail.log.
# usage (repo root on the GPU machine): OUT=/some/dir bash bench/plan/settings/device.sh      (about 4 minutes)
# writes $OUT/probe.jsonl (one row per setting), $OUT/fail.log, $OUT/versions.json, $OUT/traces.tar.gz (rows with
# a trace); then, here: copy probe.jsonl into data/$CALL/ as h200.jsonl (fail.log as h200_fail.log, versions.json
# as h200_versions.json), the traces into ../data/traces/, then python bench/plan/settings/compare.py $CALL
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
specs=${SPECS:-$here/data/$CALL/specs.jsonl}  # SPECS: another file of rows (device_call4.sh)
# the quant rows load a random checkpoint of the (first) quantized spec's model; rows that name a trace write their
# allocator history into $TRACE_DIR ($OUT/traces, packed into $OUT/traces.tar.gz at the end)
model=$(python3 -c 'import json,sys; q=[json.loads(x) for x in open(sys.argv[1]) if x.strip() and json.loads(x).get("quant")]; print(json.dumps(q[0]["model"]) if q else "")' "$specs")
if [ -n "$model" ]; then
  [ -f "$PROBE_CKPT/config.json" ] || python3 "$here/../zero_mem_probe_plan.py" --save-random "$model" "$PROBE_CKPT" \
    || echo "random checkpoint not written: the quant rows will fail" >> "$OUT/fail.log"
  echo "checkpoint ready $(( $(date +%s) - start ))s"
fi
export TRACE_DIR=${TRACE_DIR:-$OUT/traces}; mkdir -p "$TRACE_DIR"
BUDGET_S=${BUDGET_S:-250} python3 "$here/run.py" "$specs"
if [ "$TRACE_DIR" = "$OUT/traces" ]; then
  [ -n "$(ls "$TRACE_DIR")" ] && tar czf "$OUT/traces.tar.gz" -C "$OUT" traces
  rm -rf "$TRACE_DIR"
fi
echo "elapsed $(( $(date +%s) - start ))s"

#!/bin/bash
# Issue 40's timing call on one GPU (H100 or H200): the rows of SPECS one at a time (run_rows.py), then, when asked,
# DeepSpeed's autotuner on one case (autotune.py). From the repository root on the GPU machine, .whl/ carried:
#   bash bench/plan/time/device.sh OUT SPECS        (SPECS "-": no rows, the autotuner case alone)
# Check SPECS here first (no GPU): python3 bench/plan/time/run_rows.py SPECS --check
# env: TIME_BUDGET_S (default 480): the rows' budget (a row starts only if its est_wall_s + 15 s fit what is left);
#      AUTOTUNE_MODEL: a model JSON file (or the JSON) for the autotuner case, run after the rows, with AUTOTUNE_ARGS
#      (default "--global-batch 16 --seq 2048 --micro-batches 2,4 --stages 1,2,3") and AUTOTUNE_WALL_S (default
#      300); CALL_S (default 590): the command's limit, which the budgets must fit (checked before anything runs);
#      RESUME_ROWS: an earlier call's rows.jsonl (in the tree): copied to OUT first, its rows are not run again.
# Leaves in OUT (the device returns 8 files): log.txt (this script's output), rows.jsonl, fail.log, machine.json
# (versions, GPU clocks and power before and after, the op builds), logs.tar.gz (each row's and build's whole
# output), autotune.json and autotune.tar.gz (with AUTOTUNE_MODEL).
set -u
OUT=${1:?usage: device.sh OUT SPECS}
SPECS=${2:?usage: device.sh OUT SPECS}
TIME_BUDGET_S=${TIME_BUDGET_S:-480}
AUTOTUNE_WALL_S=${AUTOTUNE_WALL_S:-300}
CALL_S=${CALL_S:-590}
here=$(dirname "$0")
mkdir -p "$OUT"

main() {
  local start at rows_s left budget rc n
  start=$(date +%s)
  at=0
  [ -n "${AUTOTUNE_MODEL:-}" ] && at=$((AUTOTUNE_WALL_S + 20))
  rows_s=$TIME_BUDGET_S
  [ "$SPECS" = "-" ] && rows_s=0
  if [ $((rows_s + at + 60)) -gt "$CALL_S" ]; then
    echo "device.sh: TIME_BUDGET_S ($rows_s) + the autotuner ($at) + 60 s (installs, packing)" \
      "exceed CALL_S ($CALL_S)"
    return 2
  fi
  if [ -n "${RESUME_ROWS:-}" ]; then
    cp "$RESUME_ROWS" "$OUT/rows.jsonl" || { echo "device.sh: RESUME_ROWS $RESUME_ROWS cannot be read"; return 1; }
  fi
  export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 HF_HUB_OFFLINE=1 TORCH_EXTENSIONS_DIR=/tmp/zp_torch_extensions
  if ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      || { echo "device.sh: the wheels of .whl/ did not install"; return 1; }
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  python3 -c 'import deepspeed, tabulate, liger_kernel, torch; print("imports ok: deepspeed", deepspeed.__version__,
    "torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))' \
    || { echo "device.sh: deepspeed, tabulate, liger_kernel or the GPU is missing (above)"; return 1; }
  echo "installed $(( $(date +%s) - start ))s"
  left=$((CALL_S - ($(date +%s) - start) - at - 30))
  budget=$(( TIME_BUDGET_S < left ? TIME_BUDGET_S : left ))
  if [ "$SPECS" != "-" ]; then
    python3 "$here/run_rows.py" "$SPECS" "$OUT" --budget-s "$budget"
    rc=$?
    echo "rows done $(( $(date +%s) - start ))s (rc $rc)"
  fi
  if [ -n "${AUTOTUNE_MODEL:-}" ]; then
    # shellcheck disable=SC2086  # AUTOTUNE_ARGS is a list of options
    timeout -k 5 $((AUTOTUNE_WALL_S + 15)) python3 "$here/autotune.py" "$OUT" "$AUTOTUNE_MODEL" \
      ${AUTOTUNE_ARGS:---global-batch 16 --seq 2048 --micro-batches 2,4 --stages 1,2,3} --wall-s "$AUTOTUNE_WALL_S"
    rc=$?
    echo "autotune done $(( $(date +%s) - start ))s (rc $rc)"
  fi
  [ -d /tmp/zp_time_logs ] && tar czf "$OUT/logs.tar.gz" -C /tmp zp_time_logs
  ls -la "$OUT"
  n=$(find "$OUT" -type f | wc -l)
  [ "$n" -le 8 ] || echo "device.sh: $n files under $OUT: the device returns 8"
  echo "call $(( $(date +%s) - start ))s"
}

main 2>&1 | tee -a "$OUT/log.txt"
exit "${PIPESTATUS[0]}"

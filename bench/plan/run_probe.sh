#!/bin/bash
# Runs zero_mem_probe_plan.py on a lent GPU machine: the first spec of SERIAL.jsonl as a smoke test
# (stops everything if it fails), then PARALLEL.jsonl four at a time (memory-capped runs only: their
# allocators stay under cap_gib), then the rest of SERIAL.jsonl one at a time until BUDGET_S runs out.
# usage (repo root on the GPU machine): BUDGET_S=520 bash bench/plan/run_probe.sh SERIAL.jsonl [PARALLEL.jsonl]
# Appends one JSON result per spec to $OUT/probe.jsonl; failures and skips go to $OUT/fail.log.
here=$(dirname "$0")
start=$(date +%s); deadline=$(( start + ${BUDGET_S:-520} ))
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
fi
export PYTHONUNBUFFERED=1 DS_ACCELERATOR=cuda
one() {  # one spec line -> $OUT/probe.jsonl or $OUT/fail.log
  local s="$1" tag=$RANDOM$RANDOM
  timeout "${2:-150}" python3 "$here/zero_mem_probe_plan.py" "$s" > /tmp/o.$tag 2>/tmp/e.$tag
  if grep -q '^RESULT' /tmp/o.$tag; then grep '^RESULT' /tmp/o.$tag | sed 's/^RESULT //' > /tmp/r.$tag
    flock $OUT/probe.jsonl -c "cat /tmp/r.$tag >> $OUT/probe.jsonl"; echo "ok $(( $(date +%s) - start ))s"
  else { echo "FAILED $s"; tail -8 /tmp/e.$tag; } >> $OUT/fail.log; echo "FAILED"; return 1; fi
}
export -f one; export here start OUT
head -1 "$1" > /tmp/smoke.jsonl; tail -n +2 "$1" > /tmp/serial.jsonl
one "$(cat /tmp/smoke.jsonl)" || { echo "smoke failed"; cat $OUT/fail.log; exit 1; }
if [ -n "$2" ]; then
  PROBE_PARALLEL=1 xargs -d '\n' -P 4 -I{} bash -c 'one "$@" 200' _ {} < "$2"
fi
while IFS= read -r s; do
  [ $(date +%s) -gt $(( deadline - 30 )) ] && { echo "SKIPPED(budget) $s" >> $OUT/fail.log; continue; }
  left=$(( deadline - $(date +%s) )); one "$s" $(( left < 150 ? left : 150 ))
done < /tmp/serial.jsonl
python3 "$here/summarize_probe.py" $OUT/probe.jsonl
echo "elapsed $(( $(date +%s) - start ))s"

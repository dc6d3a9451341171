#!/bin/bash
# Runs zero_mem_probe_plan.py with torchrun on every GPU of a lent multi-GPU machine, one spec at a time.
# usage (repo root on the GPU machine): BUDGET_S=100 bash bench/plan/run_multigpu.sh SPECS.jsonl
# Each rank prints one RESULT line (with rank and world_size); all go to $OUT/probe_multigpu.jsonl.
here=$(dirname "$0"); start=$(date +%s); deadline=$(( start + ${BUDGET_S:-100} ))
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
fi
export PYTHONUNBUFFERED=1 DS_ACCELERATOR=cuda
n=$(nvidia-smi -L | wc -l); echo "gpus: $n"; nvidia-smi --query-gpu=memory.total --format=csv,noheader
while IFS= read -r s; do
  left=$(( deadline - $(date +%s) )); [ $left -lt 20 ] && { echo "SKIPPED(budget) $s" >> $OUT/fail.log; continue; }
  timeout $left torchrun --standalone --nproc_per_node "$n" "$here/zero_mem_probe_plan.py" "$s" > /tmp/o.txt 2>/tmp/e.txt
  if grep -q '^RESULT' /tmp/o.txt; then grep '^RESULT' /tmp/o.txt | sed 's/^RESULT //' >> $OUT/probe_multigpu.jsonl; echo "ok $(( $(date +%s) - start ))s"
  else { echo "FAILED $s" | cut -c1-200; tail -6 /tmp/e.txt; } | tee -a $OUT/fail.log; fi
done < "$1"

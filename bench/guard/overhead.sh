#!/bin/bash
# Guard overhead, paired runs on ONE H200 (nothing else on the machine): guard and plain alternate, 3 pairs.
# Usage (GPU machine, repository root): bash bench/guard/overhead.sh OUT  -> OUT/overhead/*.out, then
#   python bench/guard/overhead_summary.py OUT/overhead
set -u
OUT=$1/overhead; mkdir -p $OUT
source bench/guard/common.sh
export CUDA_VISIBLE_DEVICES=0
OV='{"size":"qwen0.5b","stage":2,"mb":4,"seq":1024,"steps":40,"warmup":5}'
guard() { timeout 100 python3 -m zeropilot run --no-check --out $OUT/run-guard-$1 -- torchrun --nproc_per_node 1 --master_port $(port) $T "$OV" > $OUT/guard-$1.out 2>&1; }
plain() { timeout 100 torchrun --nproc_per_node 1 --master_port $(port) $T "$OV" > $OUT/plain-$1.out 2>&1; }
for r in 1 2 3; do
  if [ $((r % 2)) = 1 ]; then guard $r; plain $r; else plain $r; guard $r; fi
  echo "pair $r done $(date +%T)"
done
python3 bench/guard/overhead_summary.py $OUT

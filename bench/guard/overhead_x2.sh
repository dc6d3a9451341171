#!/bin/bash
# Guard overhead on TWO H200s: each pair runs guard and plain at the same time, one per GPU, and the GPUs swap
# roles every pair (so a faster card cancels out). 3 pairs, 0.5B ZeRO-2, 60 steps, median of the warm steps.
# Usage (GPU machine, repository root): bash bench/guard/overhead_x2.sh OUT  -> OUT/overhead/*.out, then
#   python bench/guard/overhead_summary.py OUT/overhead
set -u
OUT=$1/overhead; mkdir -p $OUT
source bench/guard/common.sh
OV='{"size":"qwen0.5b","stage":2,"mb":4,"seq":1024,"steps":60,"warmup":10}'
guard() { CUDA_VISIBLE_DEVICES=$2 timeout 110 python3 -m zeropilot run --no-check --out $OUT/run-guard-$1 -- \
  torchrun --nproc_per_node 1 --master_port $(port) $T "$OV" > $OUT/guard-$1.out 2>&1; }
plain() { CUDA_VISIBLE_DEVICES=$2 timeout 110 torchrun --nproc_per_node 1 --master_port $(port) $T "$OV" \
  > $OUT/plain-$1.out 2>&1; }
for r in 1 2 3; do
  if [ $((r % 2)) = 1 ]; then guard $r 0 & plain $r 1 & else plain $r 0 & guard $r 1 & fi
  wait
  echo "pair $r done $(date +%T)"
done
python3 bench/guard/overhead_summary.py $OUT | tee $OUT/summary.txt

#!/bin/bash
# Guard overhead on two H200s, built to resolve 1% (see bench/guard/README.md, "Overhead").
# Workload: Qwen2.5-0.5B shape, ZeRO-2, bf16, micro batch 8 x 2048 tokens, gradient checkpointing: a step the GPU
# bounds (~0.3 s), as a fine-tuning step is, not the Python launch rate. Each GPU runs guard (G) and plain (P)
# jobs in turn, GPU 0 G P P G and GPU 1 P G G P, so every time slot holds one of each and every GPU two of
# each; each job is pinned to its own half of the CPU cores (taskset), so the two never share a core.
# Usage (2-GPU machine, repository root): bash bench/guard/overhead_ab.sh OUT [SLOTS] ->
#   (STEPS=N: steps per run, default 50)
#   OUT/overhead-ab/{guard,plain}-g<gpu>-s<slot>.out, then python bench/guard/overhead_summary.py OUT/overhead-ab
set -u
OUT=$1/overhead-ab; SLOTS=${2:-4}; mkdir -p $OUT
source bench/guard/common.sh
STEPS=${STEPS:-50}
OV='{"size":"qwen0.5b","stage":2,"mb":8,"seq":2048,"gc":true,"steps":'$STEPS',"warmup":10}'
N=$(nproc); H=$((N / 2))
cores() { if [ "$1" = 0 ]; then echo 0-$((H - 1)); else echo $H-$((N - 1)); fi; }
job() {  # KIND GPU SLOT
  local cmd="torchrun --nproc_per_node 1 --master_port $(port) $T $OV"
  if [ "$1" = guard ]; then cmd="python3 -m zeropilot run --no-check --out $OUT/run-g$2-s$3 -- $cmd"; fi
  CUDA_VISIBLE_DEVICES=$2 timeout $((STEPS + 100)) taskset -c $(cores $2) $cmd > $OUT/$1-g$2-s$3.out 2>&1
}
for s in $(seq 1 $SLOTS); do
  if [ $(( (s / 2) % 2 )) = 0 ]; then a=guard; b=plain; else a=plain; b=guard; fi  # slots 1..4: G P P G on GPU 0
  job $a 0 $s & job $b 1 $s & wait
  echo "slot $s: GPU0 $a, GPU1 $b done $(date +%T)"
done
rm -f $OUT/run-*/stacks-rank-*.txt
python3 bench/guard/overhead_summary.py $OUT | tee $OUT/summary.txt

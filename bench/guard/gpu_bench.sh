#!/bin/bash
# The guard on two H200s: the seed scenario, each OOM class, a hang over NCCL, the guard's cost per step.
# Usage (GPU machine, repository root): bash bench/guard/gpu_bench.sh OUT   -> OUT/log.txt, OUT/runs.tar.gz
set -u
OUT=$1; R=$OUT/runs; mkdir -p $R
source bench/guard/common.sh
section() { echo "=== $1 $(date +%T)"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

section seed  # Qwen2-7B shape, LoRA r16 all-linear, ZeRO-3 in zero.Init, 16 GiB card emulated, 2 ranks, NCCL
SEED='{"size":"qwen7b","stage":3,"lora":16,"mb":1,"seq":1024,"gc":true,"zero_init":true,"cap_gib":16,"rbs":2e8,"pbs":2e7,"steps":5,"save_at":[3],"save_dir":"/tmp/seed_ck"}'
timeout 240 $ZP --out $R/seed -- torchrun --nproc_per_node 2 --master_port $(port) $T "$SEED" > $R/seed.out 2>&1
tail -30 $R/seed.out; rm -rf /tmp/seed_ck

section oom
( CUDA_VISIBLE_DEVICES=0 timeout 100 $ZP --out $R/oom-capacity -- torchrun --nproc_per_node 1 --master_port $(port) $T '{"size":"qwen0.5b","stage":2,"mb":16,"seq":2048,"cap_gib":16,"steps":2}' > $R/oom-capacity.out 2>&1
  CUDA_VISIBLE_DEVICES=0 timeout 60 $ZP --memory-history --out $R/oom-fragmentation -- python3 bench/guard/frag.py > $R/oom-fragmentation.out 2>&1 ) &
( CUDA_VISIBLE_DEVICES=1 timeout 100 $ZP --out $R/oom-save-spike -- torchrun --nproc_per_node 1 --master_port $(port) $T '{"size":"tiny","stage":3,"zero_init":true,"gather":true,"unused_head":2147483648,"cap_after_init_gib":7,"steps":3,"save16":true,"save_dir":"/tmp/s16"}' > $R/oom-save-spike.out 2>&1
  CUDA_VISIBLE_DEVICES=1 timeout 100 $ZP --out $R/oom-outside-torch -- torchrun --nproc_per_node 1 --master_port $(port) $T '{"size":"qwen0.5b","stage":2,"mb":4,"seq":1024,"steps":6,"empty_cache":true,"outside_grow_at":4,"outside_leave_gib":1}' > $R/oom-outside-torch.out 2>&1 ) &
wait
for c in capacity fragmentation save-spike outside-torch; do echo "--- $c"; tail -12 $R/oom-$c.out; done

section hang  # save on rank 0 only, NCCL, flight recorder
FAULTS_BACKEND=nccl timeout 100 $ZP --hang-timeout 12 --on-hang stop --out $R/hang-nccl -- torchrun --nproc_per_node 2 --master_port $(port) tests/guard/jobs/ds_faults.py --fault save-rank0-only --save-dir /tmp/hang_ck --deepspeed_config tests/guard/jobs/ds_config.json > $R/hang-nccl.out 2>&1
tail -25 $R/hang-nccl.out; ls -la $R/hang-nccl

section hook-cost  # the guard's own work per optimizer step, in the rank (paired overhead: overhead_ab.sh)
CUDA_VISIBLE_DEVICES=0 timeout 60 $ZP --out $R/hook-cost -- python3 bench/guard/hook_cost.py > $R/hook-cost.out 2>&1
grep RESULT $R/hook-cost.out
section done
tar czf $OUT/runs.tar.gz -C $OUT runs
ls -la $OUT

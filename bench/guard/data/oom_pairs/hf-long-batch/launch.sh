#!/bin/sh
# written by zeropilot run: the launch it watches, with the environment it ran in
export CUDA_VISIBLE_DEVICES=0
export NCCL_NVLS_ENABLE=0
export NCCL_VERSION=2.28.3-1
export OMP_NUM_THREADS=4
export TORCH_EXTENSIONS_DIR=/tmp/zp_oom_pairs_ext
torchrun --nproc_per_node 1 --master_port 45327 bench/guard/hf_long_batch.py '{"size": "qwen0.5b", "stage": 3, "lora": 16, "cap_gib": 8, "seq": 256, "long_seq": 32768, "long_at": 5, "steps": 6}'

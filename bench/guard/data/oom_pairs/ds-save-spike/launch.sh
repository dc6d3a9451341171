#!/bin/sh
# written by zeropilot run: the launch it watches, with the environment it ran in
export CUDA_VISIBLE_DEVICES=0
export NCCL_NVLS_ENABLE=0
export NCCL_VERSION=2.28.3-1
export OMP_NUM_THREADS=4
export TORCH_EXTENSIONS_DIR=/tmp/zp_oom_pairs_ext
torchrun --nproc_per_node 1 --master_port 53049 /work/main/bench/guard/train_lm.py '{"size": "tiny", "stage": 3, "zero_init": true, "gather": true, "unused_head": 2147483648, "cap_after_init_gib": 7, "steps": 3, "save16": true, "save_dir": "/tmp/oom_pairs_k5ewibpl/s16"}'

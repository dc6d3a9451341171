#!/bin/sh
# written by zeropilot run: the launch it watches, with the environment it ran in
export CUDA_VISIBLE_DEVICES=0
export NCCL_NVLS_ENABLE=0
export NCCL_VERSION=2.28.3-1
export OMP_NUM_THREADS=4
export TORCH_EXTENSIONS_DIR=/tmp/zp_oom_pairs_ext
/opt/torch/.venv/bin/python3 /work/main/bench/guard/frag.py

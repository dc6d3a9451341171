#!/bin/bash
# 1. 清理残留进程
pkill -9 python
pkill -9 torchrun
pkill -9 llamafactory-cli
sleep 3

# 2. 核心环境变量
# 【救命配置】解决显存碎片化导致的 36MiB OOM
export PYTORCH_HIP_ALLOC_CONF=expandable_segments:True,max_split_size_mb:128
# 指定使用 4 张卡（海光 DCU 用 ROCR，NVIDIA 用 CUDA）
export ROCR_VISIBLE_DEVICES=0,1,2,3
# 防止多卡保存时因硬盘慢而通信超时（30分钟）
export NCCL_TIMEOUT=1800

# 3. 启动训练
FORCE_TORCHRUN=1 llamafactory-cli train \
    binding_paired_000.yaml

#!/bin/bash
set -euo pipefail
export CUDA_VISIBLE_DEVICES=0,1,2,3
FORCE_TORCHRUN=1 NPROC_PER_NODE=4 llamafactory-cli train qwen2_lora_sft.yaml

#!/bin/sh
# written by zeropilot run: the launch it watches, with the environment it ran in
export DS_ACCELERATOR=cpu
export FORCE_TORCHRUN=1
export NPROC_PER_NODE=2
export OMP_NUM_THREADS=1
export TORCH_EXTENSIONS_DIR=/tmp/lft_ext
llamafactory-cli train /tmp/lft/train.yaml

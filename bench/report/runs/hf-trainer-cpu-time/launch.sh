#!/bin/sh
# written by zeropilot run: the launch it watches, with the environment it ran in
export DS_ACCELERATOR=cpu
export OMP_NUM_THREADS=1
export TORCH_EXTENSIONS_DIR=/tmp/rep/shared2/runjobs/cpu_run/torch_extensions
torchrun --nproc_per_node 2 --master_port 36135 /work/wt-report/tests/guard/jobs/hf_train.py /tmp/rep/shared2/runjobs/cpu_run/ckpt --stage 2 --steps 24 --save-steps 8

#!/bin/sh
# written by zeropilot run: the launch it watches, with the environment it ran in
export DS_ACCELERATOR=cpu
export OMP_NUM_THREADS=1
export TORCH_EXTENSIONS_DIR=/tmp/hc/matrix/torch_extensions
torchrun --nproc_per_node 2 --master_port 34087 /work/wt/heal-core/tests/guard/jobs/hf_train.py /tmp/hc/matrix/hf_z2-kill/ckpt --stage 2 --steps 8 --save-steps 2 --fault kill-rank1 --fault-step 5 --fault-once /tmp/hc/matrix/hf_z2-kill/fired

#!/bin/sh
# written by zeropilot run: the launch it watches
torchrun --nproc_per_node 2 --master_port 51935 /work/main/tests/guard/jobs/hf_train.py /tmp/zeropilot-runjobs-_gucdczc/cpu_run/ckpt --stage 2 --steps 96 --save-steps 32

#!/bin/sh
# written by zeropilot run: the launch it watches
torchrun --nproc_per_node 2 --master_port 40719 /work/main/tests/guard/jobs/ds_faults.py --fault kill-in-save --save-dir /tmp/zeropilot-runjobs-koqcwdes/killed_in_save/ckpt --deepspeed_config /work/main/tests/guard/jobs/ds_config.json

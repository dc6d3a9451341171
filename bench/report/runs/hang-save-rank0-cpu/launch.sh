#!/bin/sh
# written by zeropilot run: the launch it watches
torchrun --nproc_per_node 2 --master_port 41581 /work/main/tests/guard/jobs/ds_faults.py --fault save-rank0-only --save-dir /tmp/zeropilot-runjobs-koqcwdes/hang_save_rank0_only/ckpt --deepspeed_config /work/main/tests/guard/jobs/ds_config.json

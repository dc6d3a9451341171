#!/bin/sh
# written by zeropilot run: the launch it watches
torchrun --nproc_per_node 2 --master_port 39723 tests/guard/jobs/ds_faults.py --fault save-rank0-only --save-dir /tmp/hang_ck --deepspeed_config tests/guard/jobs/ds_config.json

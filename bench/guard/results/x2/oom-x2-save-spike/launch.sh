#!/bin/sh
# written by zeropilot run: the launch it watches
torchrun --nproc_per_node 2 --master_port 51319 bench/guard/train_lm.py '{"size":"tiny","stage":3,"zero_init":true,"gather":true,"unused_head":2147483648,"cap_after_init_gib":5,"steps":3,"save16":true,"save_dir":"/tmp/s16x2"}'

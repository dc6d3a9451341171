#!/bin/sh
# written by zeropilot run: the launch it watches
torchrun --nproc_per_node 2 --master_port 46777 bench/guard/train_lm.py '{"size":"qwen0.5b","stage":2,"mb":4,"seq":1024,"steps":6,"empty_cache":true,"outside_grow_at":4,"outside_leave_gib":1}'

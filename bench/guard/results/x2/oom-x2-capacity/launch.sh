#!/bin/sh
# written by zeropilot run: the launch it watches
torchrun --nproc_per_node 2 --master_port 34151 bench/guard/train_lm.py '{"size":"qwen0.5b","stage":2,"mb":16,"seq":2048,"cap_gib":16,"steps":2}'

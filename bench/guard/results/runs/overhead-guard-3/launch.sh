#!/bin/sh
# written by zeropilot run: the launch it watches
torchrun --nproc_per_node 1 --master_port 43145 bench/guard/train_lm.py '{"size":"qwen0.5b","stage":2,"mb":4,"seq":1024,"steps":30,"warmup":5}'

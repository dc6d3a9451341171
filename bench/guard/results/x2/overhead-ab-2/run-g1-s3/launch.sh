#!/bin/sh
# written by zeropilot run: the launch it watches
torchrun --nproc_per_node 1 --master_port 44599 bench/guard/train_lm.py '{"size":"qwen0.5b","stage":2,"mb":8,"seq":2048,"gc":true,"steps":100,"warmup":10}'

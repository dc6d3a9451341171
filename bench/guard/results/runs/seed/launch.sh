#!/bin/sh
# written by zeropilot run: the launch it watches
torchrun --nproc_per_node 2 --master_port 45307 bench/guard/train_lm.py '{"size":"qwen7b","stage":3,"lora":16,"mb":1,"seq":1024,"gc":true,"zero_init":true,"cap_gib":16,"rbs":2e8,"pbs":2e7,"steps":5,"save_at":[3],"save_dir":"/tmp/seed_ck"}'

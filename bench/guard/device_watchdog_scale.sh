#!/bin/bash
# Issue 41, item 4 at full size on a machine with cores to spare (the GPU machine's 16 CPU cores; no GPU used):
# 128 simulated nodes x 8 stand-in ranks, one real TCPStore, the hang and the death scenario, each in its own run so
# that one's result comes back even if the other runs out of time. On the shared 2-core VM the simulation's own
# watchdogs saturated the box (workers at 180-186%, clocks 1.2-1.5 s late at the median) and the verdicts came
# 10-16 s after the learned deadline (bench/guard/results/watchdog_scale_128x8.md).
# Registered before the run: with cores to spare, every node's verdict names rank 517 and comes within the learned
# deadline + 10 s (the target), the store's server under 10% of a core.
# usage (repository root on the device machine): bash bench/guard/device_watchdog_scale.sh OUT  (~6-9 min)
OUT=${1:?usage: device_watchdog_scale.sh OUT}
mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1
workers=$(( $(nproc) - 2 ))
(nproc; uptime; python3 -c 'import torch, sys; print(sys.version.split()[0], torch.__version__)') > "$OUT/machine.txt" 2>&1
for scenario in hang die; do
  timeout 270 python3 bench/guard/watchdog_scale.py --nodes 128 --ranks-per-node 8 --workers "$workers" \
    --scenario "$scenario" --out "$OUT/watchdog_scale_128x8_${scenario}.json" > "$OUT/${scenario}.log" 2>&1
  echo "$scenario rc $? load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/machine.txt"
done

#!/bin/bash
# One device call on nvidia-h200 (issue 14, ninth pass): host_rss_probe.py on each spec of a file, one after another.
# Usage, repository root, wheels on PYTHONPATH: bash bench/plan/run_host.sh specs/call29_host.jsonl OUT
set -u
SPECS=$1; OUT=$2; export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
i=0
while IFS= read -r spec; do
    i=$((i + 1))
    timeout 240 python3 bench/plan/host_rss_probe.py "$spec" > $OUT/probe_$i.json 2> $OUT/host_$i.log
    echo "spec $i rc $? $(tail -c 300 $OUT/probe_$i.json)"
done < $SPECS

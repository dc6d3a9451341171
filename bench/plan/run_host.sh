#!/bin/bash
# One device call on nvidia-h200 (issue 14, calls 29-31): host_rss_probe.py on each spec of a file, one after another.
# OUT/probe_N.json is spec N's result line, OUT/host_N.log its host-side events (kept as data/host/callM_probe_N.json
# and callM_host_N.log). The specs of call 29 again:
#   grep -h '^RESULT' bench/plan/data/host/call29_probe_*.json | cut -c8- | python3 -c \
#     'import json,sys; [print(json.dumps(json.loads(x)["spec"])) for x in sys.stdin]' > SPECS
# Usage, repository root, wheels on PYTHONPATH: bash bench/plan/run_host.sh SPECS OUT
set -u
SPECS=$1; OUT=$2; export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
i=0
while IFS= read -r spec; do
    i=$((i + 1))
    timeout 240 python3 bench/plan/host_rss_probe.py "$spec" > $OUT/probe_$i.json 2> $OUT/host_$i.log
    echo "spec $i rc $? $(tail -c 300 $OUT/probe_$i.json)"
done < $SPECS

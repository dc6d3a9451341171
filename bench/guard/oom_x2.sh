#!/bin/bash
# The four OOM classes again, over NCCL on two H200s (2 ranks each), under zeropilot run.
# Usage (2-GPU machine, repository root): bash bench/guard/oom_x2.sh OUT  -> OUT/runs/oom-x2-*/ and *.out
# The first three run at the same time (each rank caps its own allocator); outside-torch runs alone, since its
# helper process takes all but 1 GiB of GPU 0.
set -u
OUT=$1; R=$OUT/runs; mkdir -p $R
source bench/guard/common.sh
tr2() { echo torchrun --nproc_per_node 2 --master_port $(port); }
echo "=== oom-x2 $(date +%T)"
timeout 150 $ZP --out $R/oom-x2-capacity -- $(tr2) $T '{"size":"qwen0.5b","stage":2,"mb":16,"seq":2048,"cap_gib":16,"steps":2}' > $R/oom-x2-capacity.out 2>&1 &
timeout 150 $ZP --memory-history --out $R/oom-x2-fragmentation -- $(tr2) bench/guard/frag.py > $R/oom-x2-fragmentation.out 2>&1 &
timeout 150 $ZP --out $R/oom-x2-save-spike -- $(tr2) $T '{"size":"tiny","stage":3,"zero_init":true,"gather":true,"unused_head":2147483648,"cap_after_init_gib":5,"steps":3,"save16":true,"save_dir":"/tmp/s16x2"}' > $R/oom-x2-save-spike.out 2>&1 &
wait
echo "=== oom-x2 outside-torch $(date +%T)"
timeout 150 $ZP --out $R/oom-x2-outside-torch -- $(tr2) $T '{"size":"qwen0.5b","stage":2,"mb":4,"seq":1024,"steps":6,"empty_cache":true,"outside_grow_at":4,"outside_leave_gib":1}' > $R/oom-x2-outside-torch.out 2>&1
for c in capacity fragmentation save-spike outside-torch; do
  echo "--- $c"; grep -v Warning $R/oom-x2-$c.out | tail -14
  python3 -m zeropilot report $R/oom-x2-$c --format json > $R/oom-x2-$c.report.json 2>&1
  python3 - $R/oom-x2-$c.report.json <<'PY'
import json, sys
v = json.load(open(sys.argv[1]))["verdict"]
print("verdict:", v.get("kind"), "ranks", v.get("ranks"), "first", v.get("first_rank"), "class", v.get("class"), "|", str(v.get("reason", ""))[:200])
PY
done
rm -rf /tmp/s16x2
echo "=== oom-x2 done $(date +%T)"

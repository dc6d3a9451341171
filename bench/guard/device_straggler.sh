#!/usr/bin/env bash
# A slow GPU named by the guard's probe (guard/gpu_probe.py, runlog/stragglers.py find_gpu), on real cards.
# Usage (GPU machine, repository root, .whl/ carried): bash bench/guard/device_straggler.sh OUT     (2-3 minutes)
#
# The job: examples/raw-deepspeed/train.py (a raw DeepSpeed loop), Qwen2.5-0.5B's shape from its config (random
# weights and tokens), bf16, ZeRO-2, micro batch 4 x accumulation 2 of 1024 tokens, STEPS optimizer steps (default
# 120: the probe runs every 10 steps, a GPU straggler needs 2 windows of 4 readings), under `zeropilot run` with
# its defaults (the probe as it ships).
#
# With 2 GPUs or more (the witness): two ranks over NCCL, twice:
#   healthy: the job alone: no GPU straggler may be named; the probe's readings give its cost per step;
#   slowed:  the same job while a separate process runs a bf16 matmul loop on GPU 1 for the whole run (the card is
#            time-sliced between the two processes, as a card shared with another tenant is): `zeropilot report`
#            must name rank 1's GPU.
# With 1 GPU: two ranks' cards cannot be compared on one card (NCCL refuses two ranks on one GPU, and a co-scheduled
#   loop on the only card slows both ranks alike), so this names nothing; it measures the probe's sensitivity
#   instead: one rank, the same loop started after half the steps, the readings before and after.
# Both: bench/guard/straggler_cost.py on GPU 0 (the probe's host time to launch and its GPU time, the DataLoader
#   wrapper's cost).
# DeepSpeed and pydantic travel as wheels in .whl/ (installed into /tmp/site when the image lacks DeepSpeed).
# Back in OUT (7 files): log.txt, cost.txt, healthy.txt, slowed.txt, slowed.json, probes.txt, runs.tar.gz (the run
# directories, no checkpoint). The last line of log.txt and of probes.txt is the verdict: NAMED / NOT NAMED.
set -uo pipefail
OUT=${1:?usage: bash bench/guard/device_straggler.sh OUT}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG="$OUT/log.txt"
source bench/guard/common.sh  # the wheels of .whl/ where the image lacks DeepSpeed, then the environment
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/zp_straggler_ext}
W=${WORK:-/tmp/zp-straggler}
STEPS=${STEPS:-120}
rm -rf "$W"; mkdir -p "$W"
GPUS=$(nvidia-smi -L | wc -l)
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
  python3 -c "import torch, deepspeed, transformers; print(torch.__version__, deepspeed.__version__, transformers.__version__)"
  echo "gpus: $GPUS, steps: $STEPS"; } >> "$LOG" 2>&1
t0=$(date +%s)

# the other tenant: bf16 8192^3 products in a loop on one card, until killed
HOG='import torch, sys
a = torch.full((8192, 8192), 1.0 / 128, device="cuda", dtype=torch.bfloat16); b = torch.empty_like(a)
open(sys.argv[1], "w").close()
while True:
    for _ in range(20):
        torch.matmul(a, a, out=b)
    torch.cuda.synchronize()'
hog() {  # hog GPU READY_FILE: start the loop on that card, return once it runs
  CUDA_VISIBLE_DEVICES=$1 python3 -c "$HOG" "$2" >> "$LOG" 2>&1 &
  HOG_PID=$!
  for _ in $(seq 120); do [ -e "$2" ] && return 0; sleep 0.5; done
  echo "hog: did not start" >> "$LOG"
}
stop_hog() { [ -n "${HOG_PID:-}" ] && kill "$HOG_PID" 2>/dev/null; wait "$HOG_PID" 2>/dev/null; HOG_PID=; }
trap stop_hog EXIT

job() {  # job NAME NPROC: the training job under zeropilot run
  echo "=== $1 ($2 rank(s)) $(date +%T)" >> "$LOG"
  timeout "${JOB_TIMEOUT:-150}" $ZP --out "$W/$1" -- torchrun --nproc_per_node "$2" --master_port "$(port)" \
    examples/raw-deepspeed/train.py --deepspeed_config bench/report/ds_time.json --size qwen0.5b --seq 1024 \
    --steps "$STEPS" --save-every 100000 --save-dir "$W/ckpt-$1" >> "$LOG" 2>&1
  echo "$1: exit $? after $(( $(date +%s) - t0 )) s" >> "$LOG"
  rm -rf "$W/ckpt-$1"
}

CUDA_VISIBLE_DEVICES=0 timeout 120 python3 bench/guard/straggler_cost.py > "$OUT/cost.txt" 2>> "$LOG"
if [ "$GPUS" -ge 2 ]; then
  export CUDA_VISIBLE_DEVICES=0,1
  job healthy 2
  hog 1 "$W/hog.ready"
  job slowed 2
  stop_hog
else
  export CUDA_VISIBLE_DEVICES=0
  job healthy 1
  ( while n=$(grep -c '"event":"step"' "$W/slowed/rank-0.jsonl" 2>/dev/null); [ "${n:-0}" -lt $(( STEPS / 2 )) ]; do
      sleep 0.2; done; touch "$W/half" ) &
  WATCH=$!
  ( while [ ! -e "$W/half" ]; do sleep 0.2; done; CUDA_VISIBLE_DEVICES=0 exec python3 -c "$HOG" "$W/hog.ready" ) >> "$LOG" 2>&1 &
  HOG_PID=$!
  job slowed 1
  kill "$WATCH" 2>/dev/null
  stop_hog
fi
for run in healthy slowed; do
  python3 -m zeropilot report "$W/$run" > "$OUT/$run.txt" 2>> "$LOG"
done
python3 -m zeropilot report "$W/slowed" --format json --out "$OUT/slowed.json" 2>> "$LOG"
python3 - "$W" "$GPUS" "$STEPS" "$OUT/cost.txt" > "$OUT/probes.txt" 2>> "$LOG" <<'PY'
import json, statistics, sys
from pathlib import Path
from zeropilot.runlog import read_run, summarize

w, gpus, steps = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
cost = next((json.loads(ln[7:]) for ln in open(sys.argv[4]) if ln.startswith("RESULT ")), {})
print("cost:", json.dumps(cost))
def probes(run, rank):
    recs = [json.loads(x) for x in (run / f"rank-{rank}.jsonl").read_text().splitlines() if x.strip()]
    return [(r["step"], r["gpu_probe_seconds"]) for r in recs if r.get("event") == "step" and "gpu_probe_seconds" in r]
verdict = []
for name in ("healthy", "slowed"):
    run = w / name
    if not run.is_dir():
        print(name, "missing"); continue
    s = summarize(read_run(run))
    print(f"{name}: steps {s['steps']}, step median {s['step_seconds'].get('median')} s")
    for r in sorted(int(p.stem.split("-")[1]) for p in run.glob("rank-*.jsonl")):
        got = probes(run, r)
        xs = [x for _, x in got]
        print(f"  rank {r}: {len(xs)} probes, median {1e3 * statistics.median(xs):.4f} ms, mean "
              f"{1e3 * statistics.mean(xs):.4f} ms, max {1e3 * max(xs):.4f} ms" if xs else f"  rank {r}: no probe")
        if gpus < 2 and name == "slowed" and xs:
            half = [x for st, x in got if st <= steps // 2], [x for st, x in got if st > steps // 2 + 10]
            if half[0] and half[1]:
                print(f"  before the co-scheduled loop: mean {1e3 * statistics.mean(half[0]):.4f} ms; after: "
                      f"{1e3 * statistics.mean(half[1]):.4f} ms ({statistics.mean(half[1]) / statistics.mean(half[0]):.2f}x)")
    for g in s["gpu_stragglers"]:
        print("  gpu straggler:", json.dumps(g))
    step_s = s["step_seconds"].get("median")
    if name == "healthy" and step_s:
        every = (cost.get("probe") or {}).get("every", 10)
        ms = [x for r in range(gpus if gpus >= 2 else 1) for _, x in probes(run, r)]
        if ms:
            gpu_share = statistics.median(ms) / every / step_s
            host = (cost.get("probe") or {}).get("launch_ms")
            print(f"  probe cost per step: GPU {1e3 * statistics.median(ms) / every:.4f} ms "
                  f"({100 * gpu_share:.3f}% of the {step_s:.3f} s step)"
                  + (f", host {host / every:.4f} ms ({100 * host / 1e3 / every / step_s:.3f}%)" if host else ""))
    verdict.append((name, [g["rank"] for g in s["gpu_stragglers"]]))
v = dict(verdict)
if gpus >= 2:
    ok = v.get("healthy") == [] and v.get("slowed") == [1]
    print(("NAMED" if ok else "NOT NAMED") + f": healthy run named {v.get('healthy')}, slowed run named {v.get('slowed')} (want [] and [1])")
else:
    print("NOT NAMED: one GPU (no second card to compare with); see the probe's sensitivity above")
PY
tail -1 "$OUT/probes.txt" >> "$LOG"
tar czf "$OUT/runs.tar.gz" -C "$W" healthy slowed 2>> "$LOG"
echo "done after $(( $(date +%s) - t0 )) s" >> "$LOG"
cat "$OUT/probes.txt"
grep -E "^straggler:" "$OUT/slowed.txt"

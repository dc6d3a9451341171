#!/usr/bin/env bash
# The two-node simulation over NCCL: two `torchrun --nnodes 2 --nproc_per_node 1` launchers on one machine, one GPU
# per "node" (CUDA_VISIBLE_DEVICES 0 and 1), each under its own `zeropilot run` with its own run directory; the
# ranks publish their heartbeats in torchrun's c10d store (docs/run.md, Jobs across nodes). NEEDS 2 GPUs.
#   bash bench/guard/nccl_two_nodes.sh OUT        (about 3 minutes)
# Scenarios: clean (20 steps), straggler (global rank 1 sleeps at step 5: both nodes name rank 1 on node 1 and
# stop), node lost (node 1's processes frozen with SIGSTOP after 8 s: node 0 names node 1 lost and stops).
# Each OUT/<scenario>/node{0,1} opens with `zeropilot report OUT/<scenario>/node0 OUT/<scenario>/node1`.
set -u
OUT=${1:?usage: nccl_two_nodes.sh OUT}
source bench/guard/common.sh
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo} NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1  # the network path
LOOP=tests/guard/jobs/nodes_loop.py
tree() { local p=$1; echo "$p"; for c in $(pgrep -P "$p"); do tree "$c"; done; }

scenario() {  # NAME FREEZE_NODE LOOP_ARGS...
  local name=$1 freeze=$2; shift 2
  local d=$OUT/$name p; p=$(port); mkdir -p "$d"
  local pids=()
  for k in 0 1; do
    CUDA_VISIBLE_DEVICES=$k $ZP --out "$d/node$k" --hang-timeout 20 --on-hang stop -- \
      torchrun --nnodes 2 --nproc_per_node 1 --node_rank $k --master_addr 127.0.0.1 --master_port "$p" \
      $LOOP --backend nccl "$@" > "$d/node$k.out" 2>&1 &
    pids+=($!)
  done
  if [ "$freeze" != "-" ]; then
    sleep 25
    local frozen; frozen=$(tree "${pids[$freeze]}")
    kill -STOP $frozen
    wait "${pids[$((1 - freeze))]}"
    kill -KILL $frozen
  fi
  wait
  for k in 0 1; do python3 - "$d/node$k" <<'PY'
import json, sys, pathlib
d = pathlib.Path(sys.argv[1]); h = d / "hang.json"
v = json.loads(h.read_text())["verdict"] if h.exists() else None
print(d, "no hang.json" if v is None else (v["class"], v["ranks"], v.get("culprits"), v["cause"][:300]))
PY
  done | tee "$d/summary.txt"
}

scenario clean - --steps 20
scenario straggler - --steps 400 --sleep-rank 1 --sleep-step 5
scenario node_lost 1 --steps 4000

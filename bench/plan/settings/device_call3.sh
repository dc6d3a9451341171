#!/bin/bash
# Issue 35's one GPU call (one H200), as prepared before it: call 3's pre-registered rows (device.sh, CALL=call3,
# about 7 minutes: the 7-8 B freeze-tuning and modules_to_save rows, the shaping rows' allocator histories), then the
# 7B universal-checkpoint benchmark on the host's CPU side (../../ckpt/device_universal_7b.sh, about 5 minutes; not
# beside the GPU rows: both need the host's memory).
# usage (repo root on the GPU machine, deepspeed's wheels installed into PYTHONPATH): bash device_call3.sh DIR
# writes DIR/plan/ (probe.jsonl, fail.log, versions.json, traces.tar.gz), DIR/plan.log, DIR/ckpt/ (results-universal-7b.*,
# log-universal.txt, env-universal.txt, build-universal.txt), and DIR/plan.done, DIR/done as each part ends. Run it
# under setsid so that it outlives a device call: a second call collects what the first did not.
R=${1:?usage: device_call3.sh DIR}
mkdir -p "$R/plan" "$R/ckpt"
# SKIP_ROWS: the pre-registered rows this call leaves out (device time); their predictions stay committed
OUT=$R/plan CALL=call3 BUDGET_S=${BUDGET_S:-480} POOL_GIB=${POOL_GIB:-132} SKIP_ROWS=${SKIP_ROWS-} \
  bash bench/plan/settings/device.sh > "$R/plan.log" 2>&1
touch "$R/plan.done"
OUT=$R/ckpt bash bench/ckpt/device_universal_7b.sh > "$R/ckpt.log" 2>&1
touch "$R/done"

#!/bin/bash
# `zeropilot calibrate` on the GPU machine (issue 40): the card's speed figures (bf16 matmul at a layer's shapes, sdpa
# attention, device and pinned host copies, eager launch, DeepSpeed's CPUAdam with its JIT build, torch's AdamW) and
# the memory figures calibrate measured before, into a hardware profile. About 100 s on one GPU, the CPUAdam build
# (two C++ files, about a minute) included; NPROC=2 on a 2-GPU machine adds the links' bus bandwidth (NCCL).
# usage (repository root on the GPU machine, .whl/ carried): bash bench/plan/time/device_calibrate.sh OUT
# writes OUT/profile.json (the profile: copy its speed object into src/zeropilot/data/hardware/<gpu>-ws<N>.json),
# OUT/calibrate.txt (calibrate's text output and its exit status), OUT/calibrate.err, OUT/machine.txt
# (nvidia-smi's card and PCIe link, the CPUs), OUT/wheels.log when DeepSpeed came from .whl/.
OUT=${1:?usage: device_calibrate.sh OUT}
mkdir -p "$OUT"
start=$(date +%s)
if ! python3 -c "import deepspeed" 2>/dev/null; then
  [ -d /tmp/site/deepspeed ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl > "$OUT/wheels.log" 2>&1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/zp_calibrate_ext}
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv
  echo "cpus: $(nproc)"
  python3 -c "import torch, deepspeed; print('torch', torch.__version__, 'deepspeed', deepspeed.__version__)"
} > "$OUT/machine.txt" 2>&1
timeout 480 python3 -m zeropilot calibrate --nproc "${NPROC:-1}" --out "$OUT/profile.json" --checkpoint-dir /tmp \
  > "$OUT/calibrate.txt" 2> "$OUT/calibrate.err"
echo "exit $? after $(( $(date +%s) - start )) s" >> "$OUT/calibrate.txt"

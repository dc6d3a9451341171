#!/usr/bin/env bash
# The >=7B repeat of bench_export.py on the GPU machine's CPU side (16 cores, 128 GiB), ZeRO-2.
# DeepSpeed and pydantic are not on that image: they travel as wheels in .whl/ (device README).
# Results land in $OUT (results-7b.json / .md, log.txt, build.txt); copy them to bench/ckpt/ here.
# Tried once (2026-11-29, BENCH_TIMEOUT=440): the 2-rank ZeRO-2 build of the 7.6 B model had not finished
# after 440 s and the run printed nothing (the build's output was captured, not streamed: now build.txt).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
export DS_ACCELERATOR=cpu PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{ df -h /tmp /dev/shm; free -g; nproc; python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)"; } > "$OUT/env.txt" 2>&1
OUTS=/tmp/b7out
shm_free=$(df -k --output=avail /dev/shm 2>/dev/null | tail -1)
if [ "${shm_free:-0}" -gt 40000000 ]; then OUTS=/dev/shm/b7out; fi
echo "outputs in $OUTS" >> "$OUT/env.txt"
export BENCH_BUILD_LOG="$OUT/build.txt"
timeout "${BENCH_TIMEOUT:-450}" python3 bench/ckpt/bench_export.py --size 7b --stages 2 --reps 1 --big --low-disk \
  --no-safe-check --work /tmp/b7 --outputs "$OUTS" --results "$OUT" 2>&1 | grep -v "WARNING\|warn" > "$OUT/log.txt"
echo "exit ${PIPESTATUS[0]}" >> "$OUT/log.txt"
rm -rf /tmp/b7 "$OUTS"

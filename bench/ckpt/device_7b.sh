#!/usr/bin/env bash
# The >=7B repeat of bench_export.py on the GPU machine's CPU side (16 cores, 128 GiB), ZeRO-2, 2 ranks.
# DeepSpeed and pydantic are not on that image: they travel as wheels in .whl/ (device README).
# Results land in $OUT (results-7b.json / .md, log.txt, build.txt, env.txt); copy them to bench/ckpt/ here.
#
# Idempotent across calls on one warm machine: the checkpoint is built once into /tmp/b7 (--keep) and a
# later call goes straight to the timed runs. Sizes for Qwen2.5-7B shapes (7.62 B parameters): checkpoint
# 45.7 GB (bf16 module 15.2 + fp32 partitions 30.5), each export 30.5 GB. The checkpoint stays on disk
# (the build's two ranks hold ~90 GB of RAM); the exports go where there is room for one of them.
set -uo pipefail
[ -d /tmp/site/deepspeed ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
export DS_ACCELERATOR=cpu PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{ date; df -k /tmp /dev/shm; free -g; nproc; python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)"; } >> "$OUT/env.txt" 2>&1
avail() { df -k --output=avail "$1" 2>/dev/null | tail -1; }
mkdir -p /tmp/b7
built=0; [ -f /tmp/b7/z2/built.json ] && built=1
tmp_free=$(( $(avail /tmp) / 1000000 )); shm_free=$(( $(avail /dev/shm) / 1000000 ))
need_tmp=$(( built ? 0 : 47 ))
if [ $(( tmp_free - need_tmp )) -ge 32 ]; then OUTS=/tmp/b7out
elif [ "$shm_free" -ge 32 ]; then OUTS=/dev/shm/b7out
else echo "no room: /tmp ${tmp_free} GB free (checkpoint needs ${need_tmp} more), /dev/shm ${shm_free} GB; an export needs 31" >> "$OUT/env.txt"; exit 3
fi
[ "$built" = 1 ] || [ "$tmp_free" -ge 47 ] || { echo "no room for the checkpoint: /tmp ${tmp_free} GB" >> "$OUT/env.txt"; exit 3; }
echo "built before: $built; outputs in $OUTS" >> "$OUT/env.txt"
export BENCH_BUILD_LOG="$OUT/build.txt"
timeout "${BENCH_TIMEOUT:-560}" python3 bench/ckpt/bench_export.py --size 7b --stages 2 --reps "${BENCH_REPS:-1}" --big \
  --low-disk --no-safe-check --keep --work /tmp/b7 --outputs "$OUTS" --results "$OUT" 2>&1 \
  | grep -v "WARNING\|warn" > "$OUT/log.txt"
echo "exit ${PIPESTATUS[0]}" >> "$OUT/log.txt"
rm -rf "$OUTS"

#!/usr/bin/env bash
# The >=7B repeat of bench_export.py on the GPU machine's CPU side (16 cores, 128 GiB), 2 ranks.
# Usage there: STAGE=2 bash bench/ckpt/device_7b.sh   (then STAGE=3; one stage per call: each takes minutes)
# DeepSpeed and pydantic are not on that image: they travel as wheels in .whl/ (device README).
# Results land in $OUT (results-7b-z$STAGE.json / .md, log.txt, build.txt, env.txt); copy them to bench/ckpt/.
#
# Room (seen 2026-11-29): / has 67 GB free, /dev/shm is a 137 GB tmpfs, RAM 128 GiB. Qwen2.5-7B shapes,
# 7.62 B parameters: fp32 optimizer partitions 30.5 GB, ZeRO-2's bf16 module file 15.2 GB, each fp32
# export 30.5 GB. The optimizer files go to tmpfs (linked from the checkpoint), the rest stays on disk:
# zero_to_fp32 runs with --max_shard_size 100GB: with its default 5GB, 0.19.8 writes the whole 30.5 GB fp32
# vector into each of its 7 ZeRO-2 shards (views of one torch.cat, and torch.save keeps whole storages):
# tried, it filled the disk before finishing, and in tmpfs it was killed for memory at its 3rd of 7 shards.
set -uo pipefail
STAGE=${STAGE:-2}
[ -d /tmp/site/deepspeed ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
export DS_ACCELERATOR=cpu PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{ date; df -k /tmp /dev/shm; free -g; nproc; python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)"; } >> "$OUT/env.txt" 2>&1
for s in 2 3; do [ "$s" = "$STAGE" ] || rm -rf "/tmp/b7/z$s" "/dev/shm/b7optim/z$s"; done  # room for this stage
export BENCH_BUILD_LOG="$OUT/build.txt"
timeout "${BENCH_TIMEOUT:-560}" python3 bench/ckpt/bench_export.py --size 7b --name "7b-z$STAGE" --stages "$STAGE" \
  --reps "${BENCH_REPS:-1}" --big --low-disk --no-safe-check --keep --work /tmp/b7 --optim-dir /dev/shm/b7optim \
  --outputs /tmp/b7out --results "$OUT" \
  --z2f-args "--max_shard_size 100GB" 2>&1 | grep -v "WARNING\|warn" > "$OUT/log.txt"
echo "exit ${PIPESTATUS[0]}" >> "$OUT/log.txt"
{ date; df -k /tmp /dev/shm; free -g; } >> "$OUT/env.txt" 2>&1
rm -rf /tmp/b7out

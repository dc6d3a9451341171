#!/usr/bin/env bash
# The 7B `ckpt universal` benchmark against DeepSpeed's ds_to_universal.py on the GPU machine's CPU side (16 cores,
# 128 GiB), one ZeRO-2 checkpoint of 2 ranks, both tools in the same run: bench_universal.py --size 7b --big.
# Usage there (repo root): OUT=DIR bash bench/ckpt/device_universal_7b.sh      (about 5 minutes)
# DeepSpeed and pydantic are not on that image: they travel as wheels in .whl/ (device README).
# Results land in $OUT (results-universal-7b.json / .md, log-universal.txt, env-universal.txt); copy the results to
# bench/ckpt/.
#
# Room (device_7b.sh): / has about 67 GB free, /dev/shm is a 137 GB tmpfs in 128 GiB of RAM. Qwen2.5-7B shapes,
# 7.62 B parameters, built as bench_export.py --big builds them: SGD (no Adam state: Adam's 91 GB of fp32 states
# would not fit twice beside the outputs), saved before any step. The checkpoint's model files (15.2 GB) and
# zeropilot's output (30.5 GB of fp32) stay on disk; the optimizer files (30.5 GB) and ds_to_universal.py's output
# (30.5 GB; its folder of slices stays empty, as SGD keeps no per-element state) go to the tmpfs. Both outputs
# exist at once for the comparison, file by file.
set -uo pipefail
[ -d /tmp/site/deepspeed ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
export DS_ACCELERATOR=cpu PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{ date; df -k /tmp /dev/shm; free -g; nproc; python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)"; } >> "$OUT/env-universal.txt" 2>&1
rm -rf /tmp/u7 /dev/shm/u7optim /dev/shm/u7ds
export BENCH_BUILD_LOG="$OUT/build-universal.txt"
timeout "${BENCH_TIMEOUT:-560}" python3 bench/ckpt/bench_universal.py --size 7b --big --stages 2 --reps 1 --no-warmup \
  --work /tmp/u7 --optim-dir /dev/shm/u7optim --ds-outputs /dev/shm/u7ds --results "$OUT" \
  --note "The GPU host's CPU side (idle but for this run). SGD saved before any step: DeepSpeed's converter finds no optimizer state (it reads exp_avg and exp_avg_sq, which SGD does not keep) and writes each parameter's fp32.pt from the 16-bit weights, without cat_dim; zeropilot writes the fp32 master partitions with cat_dim 0. Before any step the two tensors are equal." \
  2>&1 | grep -v "WARNING\|warn" > "$OUT/log-universal.txt"
echo "exit ${PIPESTATUS[0]}" >> "$OUT/log-universal.txt"
{ date; df -k /tmp /dev/shm; free -g; } >> "$OUT/env-universal.txt" 2>&1
rm -rf /tmp/u7 /dev/shm/u7optim /dev/shm/u7ds

#!/bin/bash
# One device call on nvidia-h200-x2 (2026-11-30, second pass): the GPU resume check (bench/repro), the OOM classes
# over NCCL (bench/guard/oom_x2.sh), then the guard's paired overhead (bench/guard/overhead_ab.sh) and its in-rank
# cost, in that order (the overhead runs alone). Usage, repository root, wheels on PYTHONPATH:
#   bash bench/run_x2_session1.sh OUT     -> OUT/log.txt, OUT/guard.tar.gz, OUT/repro.tar.gz
set -u
OUT=$1; W=/tmp/x2s1; mkdir -p $W $OUT
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, deepspeed, transformers, peft; print('torch', torch.__version__, 'deepspeed', deepspeed.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, 'nccl', torch.cuda.nccl.version())" 2>&1 | grep -v Warn
echo "=== resume on GPU (background) $(date +%T)"
( start=$(date +%s); timeout 280 python3 bench/repro/gpu_resume.py $W/resume.json $W/resume > $W/resume.log 2>&1
  echo "resume exit $? after $(( $(date +%s) - start )) s" >> $W/resume.log ) &
RES=$!
bash bench/guard/oom_x2.sh $W/guard
wait $RES
echo "=== resume log"; grep -v Warning $W/resume.log | tail -45
echo "=== overhead $(date +%T)"
bash bench/guard/overhead_ab.sh $W/guard 4
echo "=== hook cost $(date +%T)"
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -m zeropilot run --no-check --out $W/guard/runs/hook-cost -- python3 bench/guard/hook_cost.py > $W/guard/runs/hook-cost.out 2>&1
grep RESULT $W/guard/runs/hook-cost.out
echo "=== done $(date +%T)"
find $W -name 'stacks-rank-*.txt' -size +200k -delete
tar czf $OUT/guard.tar.gz -C $W guard
# the resume folders hold each rank's captured state (GBs): bring back the verdicts and logs only
(cd $W && tar czf $OUT/repro.tar.gz resume.json resume.log $(find resume -type f -size -2M))
ls -la $OUT

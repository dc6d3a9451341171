# Sourced by the bench/guard scripts (GPU machine, repository root): the environment every run gets, the
# training workload, `zeropilot run` without the pre-run check, and a free port for torchrun.
export NCCL_NVLS_ENABLE=0 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=4
ZP="python3 -m zeropilot run --no-check"
T=bench/guard/train_lm.py
port() { python3 -c 'import socket;s=socket.socket();s.bind(("",0));print(s.getsockname()[1])'; }

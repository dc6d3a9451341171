# Sourced by the bench/guard scripts (GPU machine, repository root): the environment every run gets, the
# training workload, `zeropilot run` without the pre-run check, and a free port for torchrun.
# DeepSpeed and pydantic travel as wheels in .whl/: installed into /tmp/site when the image lacks DeepSpeed (the
# caller sets LOG first; a failed install ends the caller)
if ! python3 -c "import deepspeed" 2>/dev/null; then
  [ -d /tmp/site/deepspeed ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >> "${LOG:-/dev/null}" 2>&1 || { echo "wheels: install failed" >> "${LOG:-/dev/stderr}"; exit 1; }
  export PYTHONPATH=/tmp/site
fi
export NCCL_NVLS_ENABLE=0 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=4
ZP="python3 -m zeropilot run --no-check"
T=bench/guard/train_lm.py
port() { python3 -c 'import socket;s=socket.socket();s.bind(("",0));print(s.getsockname()[1])'; }

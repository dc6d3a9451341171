"""Build (or load, when built) one of DeepSpeed's JIT ops the way its optimizers do, and say how long it took.

``fused_adam``: ``FusedAdam`` calls ``FusedAdamBuilder().load()`` (deepspeed/ops/adam/fused_adam.py);
``cpu_adam``: ``DeepSpeedCPUAdam`` calls ``CPUAdamBuilder().load()`` (deepspeed/ops/adam/cpu_adam.py). The builders
come from the accelerator (``get_accelerator().create_op_builder``), as there; the build lands in
``TORCH_EXTENSIONS_DIR``, where the rows' processes then load it. DeepSpeed prints its own ``Time to load <op> op``.
Usage: python3 build_op.py fused_adam|cpu_adam
"""
import sys
import time

BUILDERS = {"fused_adam": "FusedAdamBuilder", "cpu_adam": "CPUAdamBuilder"}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in BUILDERS:
        sys.exit(f"usage: build_op.py {'|'.join(BUILDERS)}")
    t0 = time.time()
    from deepspeed.accelerator import get_accelerator
    builder = get_accelerator().create_op_builder(BUILDERS[sys.argv[1]])
    if builder is None:
        sys.exit(f"build_op: the {get_accelerator()._name} accelerator has no {BUILDERS[sys.argv[1]]}")
    t1 = time.time()
    builder.load(verbose=True)  # DeepSpeed then prints its own 'Time to load <op> op: <s> seconds'
    print(f"build_op {sys.argv[1]}: {time.time() - t1:.1f} s to build or load ({t1 - t0:.1f} s to import)", flush=True)

"""The parts of a step-time prediction the report's tests pass in (``runlog.timing.Predictor``).

The time model (``memory.steptime.estimate_time``) and the card table (``memory.speed.speed_for``) land beside the
report (issue 40); until then these tests drive the report's prediction path with speed figures built here and a
stand-in for the model, passed as parameters. The stand-in is deliberately simple, and its figures are never quoted
as predictions: the matrix products at a given rate (6 x parameters x tokens, a third in the forward, two thirds in
the backward, another forward with gradient checkpointing) and the optimizer step reading and writing 16 bytes per
parameter at the memory bandwidth.
"""

from __future__ import annotations

import time
from typing import Optional

from zeropilot.memory.inputs import PlanInputs
from zeropilot.memory.speed import Figure, Speed
from zeropilot.memory.steptime import StepTime, Term
from zeropilot.models.params import count_params


def speed(card: str, matmul_flops_per_s: float, measured: bool = False, source: str = "a test's figure") -> Speed:
    """Speed figures for ``card``: every rate from the matrix-product rate given (peak: twice it)."""
    fig = Figure(matmul_flops_per_s, source, measured)
    bandwidth = Figure(matmul_flops_per_s / 4, source, measured)
    return Speed(card=card, peak_flops_per_s=Figure(2 * matmul_flops_per_s, source), matmul_flops_per_s=fig,
                 attention_flops_per_s=fig, mem_bytes_per_s=bandwidth, h2d_bytes_per_s=bandwidth,
                 d2h_bytes_per_s=bandwidth, cpu_adam_elems_per_s=Figure(1e9, source, measured),
                 torch_cpu_adamw_elems_per_s=Figure(1e9, source, measured), launch_s=Figure(1e-5, source, measured))


def cpu_speed(n: int = 256, repeats: int = 5) -> Speed:
    """This CPU's float32 matrix-product rate, measured now (numpy, n x n x n, the best of ``repeats``)."""
    import numpy as np

    a = np.ones((n, n), dtype=np.float32)
    best: Optional[float] = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ a
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    return speed("cpu", 2 * n**3 / max(best or 1e-6, 1e-9), measured=True,
                 source=f"numpy {n}x{n}x{n} float32 on this CPU, measured by the test")


def standin_estimate(inputs: PlanInputs, sp: Speed) -> StepTime:
    """A stand-in for the time model with its interface (see the module's docstring)."""
    params = count_params(inputs.arch).active
    tokens = inputs.micro_batch * inputs.seq_len * inputs.grad_accum
    forward = 2 * params * tokens / sp.matmul_flops_per_s.value
    backward = 2 * forward + (forward if inputs.gradient_checkpointing else 0.0)
    step = 16 * params / inputs.world_size / sp.mem_bytes_per_s.value
    terms = (Term("matmul", forward, "forward", "2 x parameters x tokens at the matmul rate"),
             Term("matmul", backward, "backward", "twice the forward" + (", and a recomputed forward"
                                                                          if inputs.gradient_checkpointing else "")),
             Term("optimizer", step, "step", "16 bytes per parameter of the partition at the memory bandwidth"))
    return StepTime(step_s=forward + backward + step, terms=terms, tokens_per_step=tokens,
                    model_flops=6 * params * tokens, peak_flops_per_s=sp.peak_flops_per_s.value,
                    world_size=inputs.world_size, card=sp.card, estimated=tuple(sp.estimated()))

"""The speed figures the time model reads: one GPU, its host and its links, each figure with where it came from.

A figure is either measured (``zeropilot calibrate`` on this card: a hardware profile's ``speed`` object) or an
estimate (the built-in card table, :mod:`zeropilot.memory.cards`, from the vendor's datasheet times a stated
efficiency), never a silent guess: :meth:`Speed.estimated` names every figure that was not measured, and the plan
prints them.

Pure data; :func:`speed_for` builds one from a card name and/or a profile.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Tuple


@dataclass(frozen=True)
class Figure:
    """One speed figure.

    Attributes:
        value: the figure in its unit (the field's name says which).
        source: where it came from, in words (``measured by zeropilot calibrate, profile nvidia-h100-ws1.json``,
            ``card table: H100 SXM datasheet 989 TFLOP/s x 0.80 (the ratio calibrate measured on an H100)``).
        measured: measured on this card and host (a profile), not estimated.
    """

    value: float
    source: str
    measured: bool = False


@dataclass(frozen=True)
class MatmulPoint:
    """A bf16 matrix product ``(m x k) @ (k x n)`` measured by ``calibrate``: FLOP/s = 2mkn / seconds."""

    m: int
    k: int
    n: int
    flops_per_s: float


@dataclass(frozen=True)
class Speed:
    """What one GPU and its host do per second.

    Attributes:
        card: the card's name as the table or the profile names it (``NVIDIA H100 80GB HBM3``).
        peak_flops_per_s: the card's dense bf16 peak by its datasheet (the denominator of MFU; never measured).
        matmul_flops_per_s: achievable dense bf16 matrix-product rate at a transformer layer's large shapes.
        matmul_points: the rates ``calibrate`` measured at several layer shapes (empty for an estimate); the time
            model reads the rate at a shape from them where they cover it.
        attention_flops_per_s: achievable rate of ``scaled_dot_product_attention`` (causal, bf16, forward and
            backward together), counted as the model counts attention FLOPs.
        mem_bytes_per_s: device memory bandwidth, bytes read plus written per second (a large device copy).
        h2d_bytes_per_s / d2h_bytes_per_s: pinned host-to-device and device-to-host copies.
        cpu_adam_elems_per_s: DeepSpeed's CPUAdam, fp32 elements updated per second by one process using
            ``cpu_adam_threads`` threads.
        torch_cpu_adamw_elems_per_s: torch's AdamW on the host (an offloaded optimizer with ``torch_adam``), the
            same unit, with the same threads.
        cpu_adam_threads: the threads the two CPU rates were measured with (None: unknown).
        launch_s: host time per eager kernel launch (PyTorch's dispatch and the launch), seconds.
        intra_busbw_bytes_per_s / inter_busbw_bytes_per_s: collective bus bandwidth (nccl-tests' definition)
            between the GPUs of one node and across nodes; None where neither measured nor in the table.
    """

    card: str
    peak_flops_per_s: Figure
    matmul_flops_per_s: Figure
    attention_flops_per_s: Figure
    mem_bytes_per_s: Figure
    h2d_bytes_per_s: Figure
    d2h_bytes_per_s: Figure
    cpu_adam_elems_per_s: Figure
    torch_cpu_adamw_elems_per_s: Figure
    launch_s: Figure
    cpu_adam_threads: Optional[int] = None
    matmul_points: Tuple[MatmulPoint, ...] = ()
    intra_busbw_bytes_per_s: Optional[Figure] = None
    inter_busbw_bytes_per_s: Optional[Figure] = None
    notes: Tuple[str, ...] = field(default=())

    def figures(self) -> List[Tuple[str, Figure]]:
        """Every figure with its field name."""
        out = []
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if isinstance(value, Figure):
                out.append((name, value))
        return out

    def estimated(self) -> List[str]:
        """The names of the figures that were not measured on this card."""
        return [name for name, fig in self.figures() if not fig.measured and name != "peak_flops_per_s"]

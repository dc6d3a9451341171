"""The time model: seconds per optimizer step on one GPU, term by term, each with its reason.

Pure functions of the plan's inputs (:class:`~zeropilot.memory.inputs.PlanInputs`) and the card's speed figures
(:class:`~zeropilot.memory.speed.Speed`); no torch. Formulas and their evidence: ``docs/plan.md`` (Time).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from zeropilot.memory.inputs import PlanInputs
from zeropilot.memory.speed import Speed

#: the guard's phases (``runlog`` step records' ``phase_seconds``) a term's time falls in
PHASES = ("forward", "backward", "step")


@dataclass(frozen=True)
class Term:
    """One part of an optimizer step's time.

    Attributes:
        name: what it is (``matmul``, ``attention``, ``elementwise``, ``loss``, ``launch``, ``zero3_fetch``,
            ``collectives``, ``optimizer``, ``offload_copies``, ``cpu_adam``, ...).
        seconds: its time per optimizer step (all micro batches), as it adds to the step (overlapped time is 0).
        phase: the guard's phase it falls in (:data:`PHASES`).
        reason: how it was worked out, in words, with the figures it used.
    """

    name: str
    seconds: float
    phase: str
    reason: str


@dataclass(frozen=True)
class StepTime:
    """One optimizer step on one GPU.

    Attributes:
        step_s: seconds per optimizer step.
        terms: what makes it up (their seconds add up to ``step_s``).
        tokens_per_step: tokens one GPU trains on per optimizer step (micro batch x sequence x accumulation).
        model_flops: the model's FLOPs per step on one GPU (6 x trainable-path parameters x tokens and attention,
            without recomputation: what MFU counts).
        peak_flops_per_s: the card's datasheet peak (MFU's denominator).
        world_size: GPUs of the job.
        estimated: the speed figures this used that were not measured on the card (:meth:`Speed.estimated`).
    """

    step_s: float
    terms: Tuple[Term, ...]
    tokens_per_step: int
    model_flops: float
    peak_flops_per_s: float
    world_size: int
    card: str = ""
    estimated: Tuple[str, ...] = ()
    notes: Tuple[str, ...] = field(default=())

    @property
    def tokens_per_s(self) -> float:
        """Tokens per second on one GPU."""
        return self.tokens_per_step / self.step_s

    @property
    def job_tokens_per_s(self) -> float:
        """Tokens per second of the whole job (every GPU)."""
        return self.tokens_per_s * self.world_size

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation: the model's FLOPs per second against the card's datasheet peak."""
        return self.model_flops / self.step_s / self.peak_flops_per_s

    def phases(self) -> Dict[str, float]:
        """Seconds per guard phase (``forward``, ``backward``, ``step``) per optimizer step."""
        out = {p: 0.0 for p in PHASES}
        for t in self.terms:
            out[t.phase] += t.seconds
        return out


@dataclass(frozen=True)
class RunTime:
    """The whole run: how many optimizer steps, how long, what it costs.

    Attributes:
        steps: optimizer steps, None when the launch does not say how long it is (``reason`` says what is missing).
        seconds: wall time of the steps (no start-up, evaluation or saves), None with ``steps``.
        gpu_hours: ``seconds`` x GPUs / 3600.
        cost: ``gpu_hours`` x the cost of a GPU-hour, None without one.
        reason: where ``steps`` came from, or why it is unknown.
    """

    steps: Optional[int]
    seconds: Optional[float]
    gpu_hours: Optional[float]
    cost: Optional[float]
    reason: str


def estimate_time(inputs: PlanInputs, speed: Speed) -> StepTime:
    """The time of one optimizer step of ``inputs`` on the card of ``speed``."""
    raise NotImplementedError  # filled in by the time model (this commit defines the interface)


def terms_text(step: StepTime) -> List[str]:
    """The step's terms for people, one line each."""
    return [f"  {t.name:28s}{t.seconds:9.3f} s   {t.reason}" for t in step.terms]

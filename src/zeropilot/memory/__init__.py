"""The memory estimator: pure functions from (model, hardware, launch settings) to bytes, with reasons.

Use::

    from zeropilot.memory import PlanInputs, make_plan, parse_gpus, search
    from zeropilot.models import resolve_model
    plan = make_plan(PlanInputs(resolve_model("Qwen/Qwen2-7B"), parse_gpus("4x16GiB"), stage=3,
                                seq_len=1024, lora_rank=16, gradient_checkpointing=True))
    plan.gpu_peak_bytes, plan.verdict.message, plan.checkpoint.total_bytes

Formulas and the origin of each constant: ``docs/plan.md``; accuracy: ``bench/plan/results/accuracy.md``.
"""

from zeropilot.memory.constants import DEFAULT, Constants
from zeropilot.memory.disk import Checkpoint, estimate_checkpoint
from zeropilot.memory.gpu import Component, GpuMemory, estimate_gpu
from zeropilot.memory.host import HostMemory, estimate_host
from zeropilot.memory.inputs import Hardware, PlanInputs, parse_gpus
from zeropilot.memory.plan import SAFE_MARGIN, Plan, Verdict, make_plan, verdict_of
from zeropilot.memory.search import Candidate, deepspeed_config, search, training_changes

__all__ = ["Candidate", "Checkpoint", "Component", "Constants", "DEFAULT", "GpuMemory", "Hardware", "HostMemory",
           "Plan", "PlanInputs", "SAFE_MARGIN", "Verdict", "deepspeed_config", "estimate_checkpoint",
           "estimate_gpu", "estimate_host", "make_plan", "parse_gpus", "search", "training_changes", "verdict_of"]

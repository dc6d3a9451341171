"""Host (CPU) memory of a ZeRO launch: per process and per node, with offload and pinned buffers."""

from __future__ import annotations

from dataclasses import dataclass

from zeropilot.memory.constants import DEFAULT, GIB, Constants
from zeropilot.memory.inputs import PlanInputs


@dataclass(frozen=True)
class HostMemory:
    """Host memory estimate.

    Attributes:
        per_process_bytes: resident memory of one training process at steady state.
        per_node_bytes: all processes of one node.
        load_peak_per_node_bytes: extra while every rank loads the 16-bit weights on the CPU before
            DeepSpeed takes them (``from_pretrained`` without ``zero.Init``), per node.
        reason: how it was worked out.
    """

    per_process_bytes: int
    per_node_bytes: int
    load_peak_per_node_bytes: int
    reason: str


def estimate_host(inputs: PlanInputs, params: int, trainable: int, c: Constants = DEFAULT) -> HostMemory:
    """Host memory for ``inputs`` (``params``/``trainable`` from the GPU estimate)."""
    n = inputs.world_size
    per_node = inputs.hardware.gpus_per_node if inputs.hardware else 1
    proc = c.host_base
    why = f"{c.host_base / GIB:.1f} GiB per process (Python, CUDA, libraries; measured)"
    if inputs.offload_optimizer == "cpu":
        part = trainable / n if inputs.stage >= 1 else trainable
        proc += c.host_offload_per_param * part
        why += (f" + {c.host_offload_per_param:.0f} B × {part / 1e6:.0f} M offloaded trainable elements (fp32 "
                f"master, AdamW states, fp32 and pinned 16-bit gradients; measured on H200 with torch AdamW)")
    if inputs.offload_param == "cpu":
        proc += 2 * params / n
        why += f" + 2 B × {params / n / 1e6:.0f} M offloaded 16-bit parameters (pinned)"
    one_copy = inputs.stage == 3 and inputs.zero_init
    load = 2 * params if one_copy else 2 * params * per_node
    why += ("; loading: ZeRO-3 in zero.Init reads the 16-bit weights once per node" if one_copy else
            "; loading: every rank holds the whole 16-bit model on the CPU (no zero.Init)")
    return HostMemory(int(proc), int(proc * per_node), int(load), why)

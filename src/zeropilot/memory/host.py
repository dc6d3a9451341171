"""Host (CPU) memory of a ZeRO launch: per process and per node, with offload and pinned buffers.

Pinned buffers cost more than their size: PyTorch's caching host allocator rounds every pinned block up
to a power of two, and parameter offload pins one block per parameter partition (measured peak RSS,
``bench/plan/data/h200x2_call3.jsonl``: Qwen2.5-7B held ~2x its 16-bit size on the host, Llama-3.1-8B
~1.1x, as the rounding of their matrix shapes predicts).

Parameter offload with the optimizer on the GPU holds more (call 29, ``bench/plan/host_rss_probe.py``: DeepSpeed's
host-side steps logged with the pinned allocator's statistics, ``bench/plan/data/host_call29``): ZeRO-3 copies the
per-parameter partitions into one flat pinned 16-bit buffer per parameter group (``stage3.py``
``_create_param_groups_fp16_flat_cpu_memory``, rounded up to a power of two as well; the per-parameter blocks stay
cached), and each sub-group's fp32 master is made on the GPU from that CPU buffer with ``.to(device, dtype=float32)``,
which converts on the CPU first: a transient fp32 copy of one sub-group on the host (``_create_fp32_partitions``), and
the same again where the step copies the fp32 master back. With offload_optimizer the fp32 master lives on the CPU
and is counted per element.
"""

from __future__ import annotations

from dataclasses import dataclass

from zeropilot.memory.constants import DEFAULT, GIB, Constants
from zeropilot.memory.inputs import PlanInputs
from zeropilot.models.params import tensor_sizes


def _pow2(n: float) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def pinned_param_bytes(inputs: PlanInputs) -> int:
    """Host bytes of the pinned 16-bit parameter partitions of one rank (offload_param), rounded as the
    caching host allocator rounds them."""
    n = inputs.world_size
    return sum(_pow2(2 * -(-size // n)) for size in tensor_sizes(inputs.arch))


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
        per = c.host_offload_per_param_z3 if inputs.stage == 3 else c.host_offload_per_param
        proc += per * part
        why += (f" + {per:.1f} B × {part / 1e6:.0f} M offloaded trainable elements (fp32 "
                f"master, AdamW states, fp32 and pinned 16-bit gradients; measured on H200 with torch AdamW)")
    if inputs.offload_param == "cpu":
        pinned = pinned_param_bytes(inputs)
        proc += pinned
        why += (f" + {pinned / GIB:.1f} GiB pinned 16-bit parameter partitions ({params / n / 1e6:.0f} M "
                "elements, each block rounded up to a power of two by the pinned-memory allocator)")
        if inputs.offload_optimizer == "none":
            part = -(-params // n)
            flat, convert = _pow2(2 * part), 4 * min(inputs.sub_group_size, part)
            proc += flat + convert
            why += (f" + {flat / GIB:.1f} GiB flat pinned 16-bit partition (rounded to a power of two) + "
                    f"{convert / GIB:.1f} GiB transient fp32 copy of one sub-group, made on the CPU on its way to "
                    "the GPU's fp32 master (call 29's host logs)")
    one_copy = inputs.stage == 3 and inputs.zero_init
    load = 2 * params if one_copy else 2 * params * per_node
    why += ("; loading: ZeRO-3 in zero.Init reads the 16-bit weights once per node" if one_copy else
            "; loading: every rank holds the whole 16-bit model on the CPU (no zero.Init)")
    return HostMemory(int(proc), int(proc * per_node), int(load), why)

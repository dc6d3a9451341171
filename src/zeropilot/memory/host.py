"""Host (CPU) memory of a ZeRO launch: per process and per node, with offload and pinned buffers.

Pinned buffers cost more than their size: PyTorch's caching host allocator rounds every pinned block up
to a power of two, and parameter offload pins one block per parameter partition (measured peak RSS,
``bench/plan/data/rows.jsonl``, source ``h200x2_call3``: Qwen2.5-7B held ~2x its 16-bit size on the host, Llama-3.1-8B
~1.1x, as the rounding of their matrix shapes predicts).

Parameter offload with the optimizer on the GPU holds more (call 29, ``bench/plan/host_rss_probe.py``: DeepSpeed's
host-side steps logged with the pinned allocator's statistics, ``bench/plan/data/host/call29_*``): ZeRO-3 copies the
per-parameter partitions into one flat pinned 16-bit buffer per parameter group (``stage3.py``
``_create_param_groups_fp16_flat_cpu_memory``, rounded up to a power of two as well; the per-parameter blocks stay
cached), and each sub-group's fp32 master is made on the GPU from that CPU buffer with ``.to(device, dtype=float32)``,
which converts on the CPU first: a transient fp32 copy of one sub-group on the host (``_create_fp32_partitions``), and
the same again where the step copies the fp32 master back. With offload_optimizer the fp32 master lives on the CPU
with the rest of the optimizer (:func:`_optimizer_offload`, calls 30 and 31).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from zeropilot.memory.constants import DEFAULT, GIB, Constants
from zeropilot.memory.inputs import PlanInputs
from zeropilot.models.params import count_params, tensor_sizes


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
            DeepSpeed takes them (``from_pretrained`` without ``zero.Init``), per node; a quantized model passes
            through the host one tensor at a time.
        reason: how it was worked out.
    """

    per_process_bytes: int
    per_node_bytes: int
    load_peak_per_node_bytes: int
    reason: str


def _optimizer_offload(inputs: PlanInputs, part: int) -> Tuple[int, str]:
    """Host bytes of offload_optimizer for one rank's ``part`` trainable elements, and what they are.

    As calls 30 and 31's host logs show them (``bench/plan/host_rss_probe.py``, ``bench/plan/data/host/call30_*``,
    ``call31_*``), each pinned block rounded up to a power of two. ZeRO-1/2 (``stage_1_and_2.py``): the fp32 master
    partition, a 16-bit copy and the fp32 gradient partition, pinned, and a pinned 16-bit buffer of the largest
    gradient; AdamW's two fp32 states. ZeRO-3 (``stage3.py``): the fp32 master (pageable), the pinned 16-bit gradient
    partition and one pinned fp32 gradient buffer per sub-group; the step runs sub-group by sub-group, the first one
    creating each sub-group's AdamW states. DeepSpeed's CPUAdam updates in place; torch's AdamW (``torch_adam``) also
    makes two fp32 temporaries of what it updates (the partition, or one sub-group) while it runs, which from the
    second step on sit beside all the states.
    """
    temps = 8 if inputs.torch_adam else 0
    optimizer = "torch's AdamW" if inputs.torch_adam else "DeepSpeed's CPUAdam"
    if inputs.stage in (1, 2):
        largest = 0 if inputs.lora_rank else count_params(inputs.arch).largest
        pinned = 2 * _pow2(4 * part) + _pow2(2 * part) + _pow2(2 * largest)
        step = (8 + temps) * part
        return pinned + step, (f"pinned fp32 master and gradients, 16-bit copy and gradient buffer "
                               f"{pinned / GIB:.1f} GiB; {optimizer}'s states"
                               + (" and step temporaries" if temps else "") + f" {step / GIB:.1f} GiB")
    sizes = [min(inputs.sub_group_size, part - k) for k in range(0, part, inputs.sub_group_size)] or [0]
    pinned = _pow2(2 * part) + sum(_pow2(4 * s) for s in sizes)
    step = 8 * part + temps * max(sizes)  # from the second step on every sub-group's states exist
    return 4 * part + pinned + step, (f"fp32 master {4 * part / GIB:.1f} GiB, pinned gradient buffers "
                                      f"{pinned / GIB:.1f} GiB, {optimizer}'s states"
                                      + (" and the step's temporaries" if temps else "")
                                      + f" {step / GIB:.1f} GiB over {len(sizes)} sub-group(s)")


def estimate_host(inputs: PlanInputs, params: int, trainable: int, c: Constants = DEFAULT) -> HostMemory:
    """Host memory for ``inputs`` (``params``/``trainable`` from the GPU estimate)."""
    n = inputs.world_size
    per_node = inputs.hardware.gpus_per_node if inputs.hardware else 1
    proc = c.host_base
    why = f"{c.host_base / GIB:.1f} GiB per process (Python, CUDA, libraries; measured)"
    part = -(-trainable // n)  # this rank's partition of the trainable elements
    if inputs.offload_optimizer == "cpu":
        opt, what = _optimizer_offload(inputs, part)
        proc += opt
        why += f" + {opt / GIB:.1f} GiB offloaded optimizer ({what})"
    if inputs.offload_param == "cpu":
        pinned = pinned_param_bytes(inputs)
        flat = _pow2(2 * part)
        proc += pinned + flat
        why += (f" + {pinned / GIB:.1f} GiB pinned 16-bit parameter partitions ({params / n / 1e6:.0f} M "
                "elements, each block rounded up to a power of two by the pinned-memory allocator) + "
                f"{flat / GIB:.1f} GiB flat pinned 16-bit partition of the trainable ones")
        if inputs.zero_init and inputs.arch.tied:
            # zero.Init partitions (and pins) the output layer's weight before transformers ties it to the embedding;
            # the released pinned block stays in the caching host allocator (calls 32, 33 and 46: 0.4-2.3 GiB more
            # RSS on the tied models only, one block of the embedding's partition rounded up to a power of two)
            tied = _pow2(2 * -(-inputs.arch.vocab * inputs.arch.hidden // n))
            proc += tied
            why += f" + {tied / GIB:.1f} GiB pinned block of the untied output layer, released in zero.Init"
        if inputs.offload_optimizer == "none":
            convert = 4 * min(inputs.sub_group_size, part)
            proc += convert
            why += (f" + {convert / GIB:.1f} GiB transient fp32 copy of one sub-group, made on the CPU on its way to "
                    "the GPU's fp32 master (call 29's host logs)")
    one_copy = inputs.stage == 3 and inputs.zero_init
    if inputs.quant_bits:
        # transformers gives a bitsandbytes-quantized load the device map of the current GPU when none is set
        # (quantizers/quantizer_bnb_4bit.py and _8bit.py ``update_device_map``; LLaMA-Factory sets the same itself
        # outside ZeRO-3): each tensor goes to the GPU as it is read, never the whole model on the host (witness:
        # tests/memory/test_settings_witness.py)
        load = 2 * count_params(inputs.arch).largest * per_node
        why += ("; loading: a quantized model loads tensor by tensor onto each rank's GPU (one 16-bit tensor on the "
                "host)")
    else:
        load = 2 * params if one_copy else 2 * params * per_node
        why += ("; loading: ZeRO-3 in zero.Init reads the 16-bit weights once per node" if one_copy else
                "; loading: every rank holds the whole 16-bit model on the CPU (no zero.Init)")
    return HostMemory(int(proc), int(proc * per_node), int(load), why)

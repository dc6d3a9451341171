"""What trains and how it is held, for the estimator: the trainable parameters of LoRA on named modules (with
``modules_to_save`` copies), of LLaMA-Factory's freeze tuning and of full fine-tuning; the frozen base's bytes when
bitsandbytes quantizes it; the layers whose forward saves anything for the backward; the loss's buffers when a fused
loss never materialises the logits; the optimizer's state per element. Pure functions of :class:`PlanInputs`.

Sizes follow the libraries' code (versions as ``docs/plan-settings.md`` lists them):

- bitsandbytes 4-bit (``Linear4bit``, ``Params4bit``): two weights per byte, one absmax per 64-element block (fp32, or
  with double quantization one byte plus an fp32 absmax per 256 blocks); 8-bit (``Linear8bitLt``): one byte per weight
  and an fp32 scale per output row. transformers quantizes every ``nn.Linear`` but the output layer
  (``get_keys_to_not_convert``); the embedding, the norms and an untied output layer stay 16-bit. The quantization
  state is an attribute of the parameter, not a parameter: ZeRO-3 partitions the packed weights, not the state.
  ``MatMul4Bit`` dequantizes the weight to 16 bits for each matmul (forward, and backward for the input's gradient)
  and saves only the packed weight.
- Liger 0.8.5's fused linear cross-entropy (``ops/fused_linear_cross_entropy.py``): logits for one chunk of
  ``next_pow2(ceil(BT / ceil(V / H)))`` tokens at a time in one reused buffer, the input's gradient (BT x H, 16-bit)
  made in the forward and kept for the backward, and the output layer's weight gradient (V x H, 16-bit) when it
  trains. Cut cross-entropy (Apple's ``cut-cross-entropy``) keeps no logits at all: the input's gradient and, when
  the output layer trains, its weight's.
- bitsandbytes' 8-bit AdamW (``Optimizer8bit``, block-wise): two one-byte states and an fp32 absmax per 256
  elements each; its fused kernel updates in place (no foreach temporaries).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from zeropilot.memory.inputs import PlanInputs
from zeropilot.models.params import ParamCounts, lora_trainable
from zeropilot.models.trainable import (Param, first_trainable_layer, freeze_trainable, layer_named, linear_modules,
                                        lora_modules, lora_params, saved_modules)

#: bytes per weight of a bitsandbytes 4-bit matrix: packed weights, absmax per 64 (fp32, or one byte plus an fp32
#: absmax per 256 blocks with double quantization)
QUANT4_BYTES = {False: 0.5 + 4 / 64, True: 0.5 + 1 / 64 + 4 / (64 * 256)}
#: bytes per element of bitsandbytes' 8-bit AdamW state: two one-byte states, each with an fp32 absmax per 256
ADAM8_BYTES = 2 * (1 + 4 / 256)


def is_lora(inputs: PlanInputs) -> bool:
    return inputs.lora_rank is not None


def _targets(inputs: PlanInputs):
    return inputs.lora_targets if inputs.lora_targets not in (None, "all-linear") else None


def trainable_list(inputs: PlanInputs) -> Optional[List[Param]]:
    """The trainable tensors by name, where they are a subset of the model's (freeze tuning; LoRA's
    ``modules_to_save`` copies); None for full fine-tuning."""
    if inputs.freeze is not None:
        f = inputs.freeze
        return freeze_trainable(inputs.arch, f.layers, f.modules, f.extra, f.llama_pro)
    if is_lora(inputs) and inputs.modules_to_save:
        return saved_modules(inputs.arch, inputs.modules_to_save)
    return None


def trainable_params(inputs: PlanInputs, counts: ParamCounts) -> int:
    """Parameters with gradients: all of them (full fine-tuning), the freeze-tuned layers and modules, or LoRA's
    adapters on the wrapped layers plus full copies of ``modules_to_save``."""
    if inputs.freeze is not None:
        return sum(p.numel for p in trainable_list(inputs) or [])
    if not is_lora(inputs):
        return counts.total
    assert inputs.lora_rank is not None
    targets, pattern = _targets(inputs), dict(inputs.lora_rank_pattern)
    if targets is None and not pattern and not inputs.dora:
        adapters = lora_trainable(inputs.arch, inputs.lora_rank)  # the all-linear count every measured row used
    else:
        adapters = lora_params(inputs.arch, inputs.lora_rank, targets, pattern, inputs.dora)
    return adapters + sum(p.numel for p in trainable_list(inputs) or [])


def quantized_elements(inputs: PlanInputs) -> Tuple[int, int, int]:
    """(elements bitsandbytes quantizes, the largest such matrix, their output rows): every decoder linear layer;
    (0, 0, 0) without quantization."""
    if inputs.quant_bits is None:
        return 0, 0, 0
    lins = linear_modules(inputs.arch)
    return (sum(p.numel for p in lins), max((p.numel for p in lins), default=0),
            sum(p.linear[1] for p in lins if p.linear))


def frozen_base_bytes(inputs: PlanInputs, counts: ParamCounts, trainable: int) -> Tuple[float, float, str]:
    """The frozen weights' bytes on one GPU before ZeRO-3 partitions them, as (partitioned, held whole, what they
    are): LoRA's whole base (16-bit, or bitsandbytes' 4/8-bit linear layers with their quantization state, which is
    not partitioned), or freeze tuning's frozen rest; (0, 0, "") for full fine-tuning."""
    if inputs.freeze is not None:
        frozen = counts.total - trainable
        return 2.0 * frozen, 0.0, f"{frozen / 1e6:.1f} M frozen weights × 2 B"
    if not is_lora(inputs):
        return 0.0, 0.0, ""
    if inputs.quant_bits is None:
        return 2.0 * counts.total, 0.0, f"{counts.total / 1e6:.1f} M frozen base weights × 2 B"
    q, _, rows = quantized_elements(inputs)
    rest = counts.total - q
    if inputs.quant_bits == 4:
        packed, state = 0.5 * q, (QUANT4_BYTES[inputs.double_quant] - 0.5) * q
        what = (f"{q / 1e6:.0f} M weights of the linear layers in 4 bits ({QUANT4_BYTES[inputs.double_quant]:.3f} B "
                f"each with their {'double-quantized ' if inputs.double_quant else ''}absmax), {rest / 1e6:.0f} M "
                "others × 2 B")
    else:
        packed, state = 1.0 * q, 4.0 * rows
        what = f"{q / 1e6:.0f} M weights of the linear layers in 8 bits (+ fp32 row scales), {rest / 1e6:.0f} M others × 2 B"
    return packed + 2.0 * rest, state, what


def dequant_bytes(inputs: PlanInputs) -> int:
    """The 16-bit copy bitsandbytes dequantizes one quantized matrix into for a matmul (the largest)."""
    return 2 * quantized_elements(inputs)[1]


def first_saving_layer(inputs: PlanInputs) -> int:
    """The first decoder layer whose forward keeps tensors for the backward: 0, or with freeze tuning the first layer
    holding a trainable parameter (the layers before it see inputs that need no gradient)."""
    if inputs.freeze is None:
        return 0
    return first_trainable_layer(inputs.arch, trainable_list(inputs) or [])


def saving_layers(inputs: PlanInputs) -> int:
    return inputs.arch.layers - first_saving_layer(inputs)


def wrapped_fraction(inputs: PlanInputs) -> Optional[Dict[str, float]]:
    """LoRA on named modules: for each linear layer of a decoder layer (``q_proj``, ``down_proj`` ...), the share of
    decoder layers where LoRA wraps it; None for all linear layers (or without LoRA)."""
    if not is_lora(inputs) or _targets(inputs) is None:
        return None
    layers = inputs.arch.layers
    shares: Dict[str, float] = {}
    wrapped = {p.name for p in lora_modules(inputs.arch, _targets(inputs))}
    for p in layer_named(inputs.arch, 0):
        if p.linear is not None:
            kind = p.module.rsplit(".", 1)[-1]
            shares[kind] = sum(1 for i in range(layers) if p.name.replace(".0.", f".{i}.", 1) in wrapped) / layers
    return shares


def wrapped_inputs(inputs: PlanInputs) -> List[Tuple[str, int, float]]:
    """LoRA on named modules: (linear layer, its input width, share of decoder layers wrapped) for each wrapped one."""
    shares = wrapped_fraction(inputs) or {}
    out = []
    for p in layer_named(inputs.arch, 0):
        kind = p.module.rsplit(".", 1)[-1]
        if p.linear is not None and shares.get(kind):
            out.append((kind, p.linear[0], shares[kind]))
    return out


def fused_loss_bytes(inputs: PlanInputs, output_trains: bool) -> Tuple[int, str]:
    """The loss's buffers at its peak with a fused loss (see the module docstring), and why."""
    a = inputs.arch
    tokens = inputs.micro_batch * inputs.seq_len
    grad_input = 2 * tokens * a.hidden
    weight_grad = 2 * a.vocab * a.hidden if output_trains else 0
    if inputs.fused_loss == "cce":
        return grad_input + weight_grad, (f"cut cross-entropy: no logits; the input's gradient ({tokens} × {a.hidden} "
                                          "× 2 B)" + (", the output layer's weight gradient" if weight_grad else ""))
    chunk = liger_chunk_tokens(inputs)
    logits = 2 * chunk * a.vocab
    return logits + grad_input + weight_grad, (
        f"Liger's fused linear cross-entropy: logits of {chunk} tokens at a time ({chunk} × {a.vocab} × 2 B), the "
        f"input's gradient ({tokens} × {a.hidden} × 2 B)" + (", the output layer's weight gradient (V × h × 2 B)"
                                                            if weight_grad else "") + "; the whole logits never exist")


def liger_chunk_tokens(inputs: PlanInputs) -> int:
    """The tokens of one chunk of Liger's fused linear cross-entropy (see the module docstring)."""
    a = inputs.arch
    tokens = inputs.micro_batch * inputs.seq_len
    inc = -(-a.vocab // a.hidden)
    return min(1 << max(0, (-(-tokens // inc) - 1).bit_length()), tokens)


def output_trains(inputs: PlanInputs) -> bool:
    """Whether the output layer's weight gets a gradient (full fine-tuning, or a trainable copy or freeze-tuned)."""
    listed = trainable_list(inputs)
    if listed is None:
        return not is_lora(inputs)
    tied_head = inputs.arch.tied and any(p.name.startswith("model.embed_tokens") for p in listed)
    return tied_head or any(p.name.startswith("lm_head") for p in listed)


def adam_bytes(inputs: PlanInputs) -> float:
    """Optimizer state per trainable element of the partition: AdamW's two fp32 states, or bitsandbytes' 8-bit."""
    return ADAM8_BYTES if inputs.optimizer == "adamw_8bit" else 8.0


def replayed(inputs: PlanInputs, zero12: bool = False) -> bool:
    """Whether the allocator replays (``memory/segments.py``) know this kind of run: plain full fine-tuning or LoRA
    (on any modules), AdamW or bitsandbytes' 8-bit AdamW (whose first step's tensors ``segments.zero12_reserved``
    knows from its source), the causal-LM loss; at ZeRO-1/2 (``zero12``) also freeze tuning and LoRA's
    ``modules_to_save`` copies, whose trainable tensors DeepSpeed flattens as it flattens full fine-tuning's, beside
    frozen ones that stay where they were built (``stage_1_and_2.py``). Quantization, fused losses and DoRA take the
    fitted components instead (their tensors were never traced)."""
    subset = zero12 or (inputs.freeze is None and not inputs.modules_to_save)
    return subset and inputs.quant_bits is None and inputs.fused_loss is None and not inputs.dora


def second_param_group(inputs: PlanInputs) -> bool:
    """Whether DeepSpeed gets a second parameter group, and so empties the cache again before flattening it: the HF
    Trainer's optimizer (``trainer_optimizer``) holds the trainable biases and norm weights in a group without weight
    decay (``Trainer.get_decay_parameter_names``: every bias and every parameter of a normalisation layer), and
    DeepSpeed drops empty groups (``engine.py``: ``param_groups[:] = [pg for pg in ... if len(pg["params"]) != 0]``).
    Full fine-tuning and freeze tuning train norms; LoRA's adapters and ``modules_to_save`` copies of the embedding and
    the output layer have none."""
    if not inputs.trainer_optimizer:
        return False
    listed = trainable_list(inputs)
    if listed is None:
        return not is_lora(inputs)
    return any(p.name.endswith(".bias") or "norm" in p.name for p in listed)

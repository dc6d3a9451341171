"""Parameter counts of an :class:`Architecture`, and the trainable count of LoRA on every linear layer.

The counts follow the module layout of the transformers implementations (checked against
``AutoModelForCausalLM.from_config`` on the meta device in ``tests/models``); LoRA counts follow PEFT's
``target_modules="all-linear"``: every ``nn.Linear`` except the output layer, each getting
``rank * (in + out)`` parameters. Mixture-of-experts weights are 3-D tensors in transformers 5, and what
PEFT 0.21.2 wraps of them depends on the family (read off ``get_peft_model`` in ``tests/models``):
Mixtral, Qwen3-MoE and DeepSeek-V2/V3 get LoRA on the router and on the routed experts
(``gate_up_proj`` with ``2 * rank * experts`` wide A/B, ``down_proj`` with ``rank * experts``), and
DeepSeek's MLP linear layers (its dense first layers and shared experts) get none; Qwen2-MoE gets it
on the shared expert and its gate only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

from zeropilot.models.arch import Architecture

Linear = Tuple[int, int]  # (in_features, out_features)


@dataclass(frozen=True)
class ParamCounts:
    """How many parameters a model has, and where.

    Attributes:
        total: every parameter (tied embeddings counted once).
        embedding: the input embedding.
        output: the output layer (0 when tied to the embedding).
        per_layer: the parameters of each decoder layer, in order.
        largest: the biggest single tensor (DeepSpeed sizes some ZeRO-3 buffers by it).
        active: parameters one token passes through (differs from ``total`` for MoE).
    """

    total: int
    embedding: int
    output: int
    per_layer: Tuple[int, ...]
    largest: int
    active: int


def attention_linears(arch: Architecture) -> List[Linear]:
    """The attention block's linear layers as (in, out)."""
    h, q, kv = arch.hidden, arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    if arch.mla is not None:
        m = arch.mla
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        q_path = [(h, arch.heads * qk)] if m.q_lora_rank is None else [(h, m.q_lora_rank),
                                                                       (m.q_lora_rank, arch.heads * qk)]
        return q_path + [(h, m.kv_lora_rank + m.qk_rope_head_dim),
                         (m.kv_lora_rank, arch.heads * (m.qk_nope_head_dim + m.v_head_dim)),
                         (arch.heads * m.v_head_dim, h)]
    if arch.fused:
        return [(h, q + 2 * kv), (q, h)]
    return [(h, q), (h, kv), (h, kv), (q, h)]


def dense_mlp_linears(arch: Architecture, intermediate: int) -> List[Linear]:
    """A gated MLP's linear layers as (in, out)."""
    h = arch.hidden
    if arch.fused:
        return [(h, 2 * intermediate), (intermediate, h)]
    return [(h, intermediate), (h, intermediate), (intermediate, h)]


def _attention_extras(arch: Architecture) -> int:
    """Biases and norms inside the attention block."""
    if arch.mla is not None:
        return arch.mla.kv_lora_rank + (arch.mla.q_lora_rank or 0)
    n = 0
    if arch.qkv_bias:
        n += (arch.heads + 2 * arch.kv_heads) * arch.head_dim
    if arch.qk_norm:
        n += 2 * arch.head_dim
    return n


def _mlp_params(arch: Architecture, index: int) -> Tuple[int, int, List[Linear]]:
    """(all MLP parameters, those one token uses, the nn.Linear layers) of layer ``index``."""
    moe = arch.moe
    if moe is None or not moe.is_moe_layer(index):
        lins = dense_mlp_linears(arch, arch.intermediate)
        n = sum(i * o for i, o in lins)
        return n, n, lins
    h = arch.hidden
    expert = 3 * h * moe.expert_intermediate
    shared_lins = dense_mlp_linears(arch, moe.shared_intermediate) if moe.shared_intermediate else []
    shared = sum(i * o for i, o in shared_lins) + (h if moe.shared_gate else 0)
    router = moe.experts * h
    if moe.shared_gate:
        shared_lins = shared_lins + [(h, 1)]
    total = moe.experts * expert + shared + router
    return total, moe.active * expert + shared + router, shared_lins


def layer_params(arch: Architecture, index: int) -> Tuple[int, int]:
    """(parameters, active parameters) of decoder layer ``index``."""
    attn = sum(i * o for i, o in attention_linears(arch)) + _attention_extras(arch)
    mlp, mlp_active, _ = _mlp_params(arch, index)
    norms = arch.norms_per_layer * arch.hidden
    return attn + mlp + norms, attn + mlp_active + norms


def count_params(arch: Architecture) -> ParamCounts:
    """Every parameter of ``arch``, the way transformers builds it."""
    embedding = arch.vocab * arch.hidden
    output = 0 if arch.tied else embedding
    layers = [layer_params(arch, i) for i in range(arch.layers)]
    per_layer = tuple(n for n, _ in layers)
    total = embedding + output + sum(per_layer) + arch.hidden
    active = embedding + output + sum(a for _, a in layers) + arch.hidden
    largest = max([embedding] + [i * o for i, o in attention_linears(arch)]
                  + [i * o for k in range(arch.layers) for i, o in _mlp_params(arch, k)[2]]
                  + _expert_tensors(arch))
    return ParamCounts(total, embedding, output, per_layer, largest, active)


def _expert_tensors(arch: Architecture) -> List[int]:
    if arch.moe is None:
        return []
    m = arch.moe
    return [m.experts * 2 * m.expert_intermediate * arch.hidden, m.experts * m.expert_intermediate * arch.hidden]


# model_type -> (router and routed experts wrapped, MLP nn.Linear layers wrapped) under PEFT 0.21.2 all-linear
_MOE_LORA = {"mixtral": (True, True), "qwen3_moe": (True, True), "qwen2_moe": (False, True),
             "deepseek_v2": (True, False), "deepseek_v3": (True, False)}


def linear_layers(arch: Architecture) -> List[Linear]:
    """Every ``nn.Linear`` of the decoder layers that all-linear LoRA wraps, as (in, out)."""
    out: List[Linear] = []
    mlp_wrapped = _MOE_LORA.get(arch.model_type, (False, True))[1]
    for index in range(arch.layers):
        out += attention_linears(arch)
        if mlp_wrapped:
            out += _mlp_params(arch, index)[2]
    return out


def _moe_lora(arch: Architecture, rank: int) -> int:
    """LoRA on the routers and the 3-D expert tensors of every MoE layer (PEFT 0.21 all-linear)."""
    m = arch.moe
    if m is None or not _MOE_LORA.get(arch.model_type, (False, True))[0]:
        return 0
    h, e, i = arch.hidden, m.experts, m.expert_intermediate
    per_layer = rank * (h + e) + 2 * rank * e * (h + 2 * i) + rank * e * (i + h)
    return per_layer * sum(1 for k in range(arch.layers) if m.is_moe_layer(k))


def lora_trainable(arch: Architecture, rank: int) -> int:
    """Trainable parameters of PEFT LoRA with ``target_modules="all-linear"`` at ``rank``."""
    return sum(rank * (i + o) for i, o in linear_layers(arch)) + _moe_lora(arch, rank)


def layer_tensor_sizes(arch: Architecture, index: int) -> List[int]:
    """Element counts of decoder layer ``index``'s matrices: its linears, then its routed experts (stored as 3-D
    tensors)."""
    total, _, lins = _mlp_params(arch, index)
    listed = [i * o for i, o in lins]
    experts = total - sum(listed)
    return [i * o for i, o in attention_linears(arch)] + listed + ([experts] if experts > 0 else [])


def tensor_sizes(arch: Architecture) -> List[int]:
    """Element counts of the model's matrices (embedding, output, every decoder layer's linears and
    expert tensors); norms and biases are left out (under 0.1% of any catalogued model)."""
    out = [arch.vocab * arch.hidden] * (1 if arch.tied else 2)
    for index in range(arch.layers):
        out += layer_tensor_sizes(arch, index)
    return out

"""Which parameters train: every tensor of a model by its transformers name, and the trainable sets of LoRA on
named modules (PEFT), full copies of named modules (PEFT ``modules_to_save``) and LLaMA-Factory's freeze tuning.

Names follow transformers 5's module layout (``model.layers.3.self_attn.q_proj.weight``), checked against
``named_parameters()`` of every supported family on the meta device in ``tests/models/test_trainable.py``, so the
matching rules of PEFT and LLaMA-Factory can be applied to them as those libraries apply them:

- PEFT (0.21.2, ``tuners/tuners_utils.py`` ``check_target_module_exists``): a module is a target when its name
  equals a listed name or ends with ``"." + name``; a single string is a regular expression matched against the
  whole name (``re.fullmatch``); ``"all-linear"`` is every ``nn.Linear`` but the output layer.
  ``rank_pattern`` keys match ``(.*\\.)?KEY$`` against the module's name (``peft/utils/other.py``
  ``get_pattern_key``). ``modules_to_save``: a module whose name ends with a listed name gets a trainable copy
  (``ModulesToSaveWrapper``) beside the frozen original.
- LLaMA-Factory (v0.9.5, ``model/adapter.py`` ``_setup_freeze_tuning``): the trainable layer ids are the last N
  (``freeze_trainable_layers`` N > 0), the first ``|N|`` (N < 0) or, with ``use_llama_pro``, every
  ``num_layers / N``-th; a parameter trains when its name contains ``".{id}.{module}"`` for a trainable id and a
  ``freeze_trainable_modules`` entry (``"all"``: ``".{id}."``) or contains a ``freeze_extra_modules`` entry (a
  substring test: ``norm`` makes every norm trainable, as in LLaMA-Factory).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

from zeropilot.models.arch import Architecture
from zeropilot.models.params import _MOE_LORA, _moe_lora, attention_linears, dense_mlp_linears


@dataclass(frozen=True)
class Param:
    """One parameter tensor.

    Attributes:
        name: its transformers name (``model.layers.0.mlp.up_proj.weight``).
        numel: elements.
        linear: (in, out) when it is an ``nn.Linear``'s weight, else None.
        layer: the decoder layer it belongs to, None for the embedding, the final norm and the output layer.
    """

    name: str
    numel: int
    linear: Optional[Tuple[int, int]] = None
    layer: Optional[int] = None

    @property
    def module(self) -> str:
        return self.name.rsplit(".", 1)[0]


def _linear(prefix: str, name: str, shape: Tuple[int, int], layer: Optional[int], bias: int = 0) -> List[Param]:
    out = [Param(f"{prefix}.{name}.weight", shape[0] * shape[1], shape, layer)]
    if bias:
        out.append(Param(f"{prefix}.{name}.bias", bias, None, layer))
    return out


def _attention(arch: Architecture, i: int) -> List[Param]:
    p = f"model.layers.{i}.self_attn"
    lins = attention_linears(arch)
    if arch.mla is not None:
        m = arch.mla
        names = (["q_proj"] if m.q_lora_rank is None else ["q_a_proj", "q_b_proj"]) + [
            "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"]
        out: List[Param] = []
        for name, shape in zip(names, lins):
            out += _linear(p, name, shape, i)
            if name == "q_a_proj":
                out.append(Param(f"{p}.q_a_layernorm.weight", m.q_lora_rank or 0, None, i))
            if name == "kv_a_proj_with_mqa":
                out.append(Param(f"{p}.kv_a_layernorm.weight", m.kv_lora_rank, None, i))
        return out
    if arch.fused:
        return _linear(p, "o_proj", lins[1], i) + _linear(p, "qkv_proj", lins[0], i)
    q, kv = arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    biases = (q, kv, kv, 0) if arch.qkv_bias else (0, 0, 0, 0)
    out = []
    for name, shape, bias in zip(("q_proj", "k_proj", "v_proj", "o_proj"), lins, biases):
        out += _linear(p, name, shape, i, bias)
    if arch.qk_norm:
        out += [Param(f"{p}.q_norm.weight", arch.head_dim, None, i), Param(f"{p}.k_norm.weight", arch.head_dim,
                                                                            None, i)]
    return out


def _mlp(arch: Architecture, i: int, prefix: str, intermediate: int) -> List[Param]:
    lins = dense_mlp_linears(arch, intermediate)
    names = ("gate_up_proj", "down_proj") if arch.fused else ("gate_proj", "up_proj", "down_proj")
    out: List[Param] = []
    for name, shape in zip(names, lins):
        out += _linear(prefix, name, shape, i)
    return out


def _moe_block(arch: Architecture, i: int) -> List[Param]:
    m, h, p = arch.moe, arch.hidden, f"model.layers.{i}.mlp"
    assert m is not None
    experts = [Param(f"{p}.experts.gate_up_proj", m.experts * 2 * m.expert_intermediate * h, None, i),
               Param(f"{p}.experts.down_proj", m.experts * m.expert_intermediate * h, None, i)]
    router = [Param(f"{p}.gate.weight", m.experts * h, None, i)]
    if arch.model_type == "qwen2_moe":
        shared = _mlp(arch, i, f"{p}.shared_expert", m.shared_intermediate) + _linear(p, "shared_expert_gate",
                                                                                      (h, 1), i)
        return router + experts + shared
    if arch.model_type.startswith("deepseek"):
        return experts + router + _mlp(arch, i, f"{p}.shared_experts", m.shared_intermediate)
    return (router + experts) if arch.model_type == "mixtral" else (experts + router)


def layer_named(arch: Architecture, i: int) -> List[Param]:
    """Decoder layer ``i``'s parameters, by name."""
    out = _attention(arch, i)
    if arch.moe is not None and arch.moe.is_moe_layer(i):
        out += _moe_block(arch, i)
    else:
        out += _mlp(arch, i, f"model.layers.{i}.mlp", arch.intermediate)
    norms = ["input_layernorm", "post_attention_layernorm"]
    if arch.norms_per_layer >= 4:
        norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
    return out + [Param(f"model.layers.{i}.{n}.weight", arch.hidden, None, i) for n in norms]


def named_parameters(arch: Architecture) -> List[Param]:
    """Every parameter of ``arch`` by its transformers name (a tied output layer is not listed: it is the
    embedding)."""
    out = [Param("model.embed_tokens.weight", arch.vocab * arch.hidden)]
    for i in range(arch.layers):
        out += layer_named(arch, i)
    out.append(Param("model.norm.weight", arch.hidden))
    if not arch.tied:
        out.append(Param("lm_head.weight", arch.vocab * arch.hidden, (arch.hidden, arch.vocab)))
    return out


def linear_modules(arch: Architecture) -> List[Param]:
    """The weights of every ``nn.Linear`` but the output layer (what ``all-linear`` LoRA and bitsandbytes wrap)."""
    return [p for p in named_parameters(arch) if p.linear is not None and p.layer is not None]


Targets = Union[None, str, Sequence[str]]


def _targeted(module: str, targets: Targets) -> bool:
    """PEFT's ``check_target_module_exists`` for a list of names or one regular expression."""
    if isinstance(targets, str):
        return re.fullmatch(targets, module) is not None
    return any(module == t or module.endswith("." + t) for t in targets)


def lora_modules(arch: Architecture, targets: Targets = None) -> List[Param]:
    """The linear layers LoRA wraps: all of them but the output layer (``targets`` None or ``"all-linear"``; for
    mixture-of-experts families as :func:`~zeropilot.models.params.linear_layers` says PEFT wraps them), or those
    PEFT matches by name."""
    if targets is None or targets == "all-linear":
        mlp = _MOE_LORA.get(arch.model_type, (False, True))[1]
        return [p for p in linear_modules(arch) if mlp or ".mlp." not in p.name]
    return [p for p in linear_modules(arch) if _targeted(p.module, targets)]


def _rank(module: str, rank: int, rank_pattern: Dict[str, int]) -> int:
    """PEFT's ``get_pattern_key``: the first key matching ``(.*\\.)?KEY$``, else ``rank``."""
    for key, value in rank_pattern.items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return rank


def lora_params(arch: Architecture, rank: int, targets: Targets = None, rank_pattern: Optional[Dict[str, int]] = None,
                dora: bool = False) -> int:
    """Trainable parameters of PEFT LoRA at ``rank`` on ``targets`` (None: all linear layers; mixture-of-experts
    tensors as :func:`~zeropilot.models.params.lora_trainable` counts them); ``rank_pattern``: ranks per module;
    ``dora``: each wrapped layer's magnitude vector (one per output feature, ``lora_magnitude_vector``)."""
    pattern = rank_pattern or {}
    total = 0
    for p in lora_modules(arch, targets):
        fan_in, fan_out = p.linear  # type: ignore[misc]
        total += _rank(p.module, rank, pattern) * (fan_in + fan_out) + (fan_out if dora else 0)
    if targets is None or targets == "all-linear":
        total += _moe_lora(arch, rank)
    return total


def saved_modules(arch: Architecture, names: Iterable[str]) -> List[Param]:
    """Parameters PEFT copies as trainable (``modules_to_save``): those of every module whose name ends with a
    listed name. A tied output layer is copied as a module of its own (``lm_head``), untied from the embedding."""
    wanted = [n for n in names if n]
    params = named_parameters(arch)
    if arch.tied:
        params.append(Param("lm_head.weight", arch.vocab * arch.hidden, (arch.hidden, arch.vocab)))
    return [p for p in params if any(p.module.endswith(n) for n in wanted)]


def freeze_layer_ids(num_layers: int, trainable_layers: int, llama_pro: bool = False) -> List[int]:
    """LLaMA-Factory's trainable layer ids (``_setup_freeze_tuning``).

    Raises:
        ValueError: ``use_llama_pro`` with a layer count not divisible by ``trainable_layers``, as LLaMA-Factory.
    """
    if llama_pro:
        if trainable_layers <= 0 or num_layers % trainable_layers:
            raise ValueError(f"use_llama_pro: num_layers {num_layers} is not divisible by freeze_trainable_layers "
                             f"{trainable_layers}")
        stride = num_layers // trainable_layers
        return list(range(stride - 1, num_layers + stride - 1, stride))
    if trainable_layers > 0:
        return list(range(max(0, num_layers - trainable_layers), num_layers))
    return list(range(min(-trainable_layers, num_layers)))


def freeze_trainable(arch: Architecture, trainable_layers: int, modules: Sequence[str] = ("all",),
                     extra: Sequence[str] = (), llama_pro: bool = False) -> List[Param]:
    """The parameters LLaMA-Factory's freeze tuning trains (see the module docstring)."""
    ids = freeze_layer_ids(arch.layers, trainable_layers, llama_pro)
    keys = [f".{i}.{'' if m == 'all' else m}" for m in modules for i in ids] + [e for e in extra if e]
    names = named_parameters(arch)
    if arch.tied and any("lm_head" in k for k in keys):
        names.append(Param("lm_head.weight", 0))  # tied: the embedding's tensor, counted once
    return [p for p in names if any(k in p.name for k in keys)]


def first_trainable_layer(arch: Architecture, trainable: Sequence[Param]) -> int:
    """The first decoder layer whose forward needs autograd: 0 when the embedding trains, else the lowest layer
    holding a trainable parameter (the layers before it see inputs that need no gradient, and save nothing)."""
    if any(p.layer is None and p.name.startswith("model.embed_tokens") for p in trainable):
        return 0
    layers = [p.layer for p in trainable if p.layer is not None]
    return min(layers) if layers else arch.layers


def moe_lora_wrapped(arch: Architecture) -> bool:
    """Whether PEFT's all-linear LoRA wraps this family's routed experts (``params._MOE_LORA``)."""
    return arch.moe is not None and _MOE_LORA.get(arch.model_type, (False, True))[0]

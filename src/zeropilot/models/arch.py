"""A decoder-only transformer's shape, read from a Hugging Face ``config.json`` without torch.

:func:`from_config` turns the dict of a ``config.json`` into an :class:`Architecture`: the handful of
sizes that parameter counts, activation memory and checkpoint sizes depend on. Families differ in a few
flags (biases on q/k/v, norms on q/k, four norms per layer, fused projections, logit soft-capping,
mixture-of-experts layers, DeepSeek's low-rank attention); everything else is shared.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple

from zeropilot.errors import InputError

# model_type -> (qkv_bias, qk_norm, norms_per_layer, fused_qkv_and_gate_up, gated_mlp)
_FAMILIES: Dict[str, Tuple[bool, bool, int, bool, bool]] = {
    "llama": (False, False, 2, False, True),
    "mistral": (False, False, 2, False, True),
    "mixtral": (False, False, 2, False, True),
    "qwen2": (True, False, 2, False, True),
    "qwen2_moe": (True, False, 2, False, True),
    "qwen3": (False, True, 2, False, True),
    "qwen3_moe": (False, True, 2, False, True),
    "gemma": (False, False, 2, False, True),
    "gemma2": (False, False, 4, False, True),
    "gemma3_text": (False, True, 4, False, True),
    "phi3": (False, False, 2, True, True),
    "deepseek_v2": (False, False, 2, False, True),
    "deepseek_v3": (False, False, 2, False, True),
}

SUPPORTED_TYPES = tuple(sorted(_FAMILIES))

#: Every ``config.json`` key :func:`from_config` reads (``text_config`` holds the same keys again): what a guarded
#: rank keeps of its model's ``config`` so that its run can be planned later (``zeropilot.guard.setup``).
CONFIG_SIZE_KEYS = (
    "model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings", "attention_bias",
    "final_logit_softcapping", "max_position_embeddings", "sliding_window", "num_experts", "num_local_experts",
    "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size", "decoder_sparse_step",
    "n_routed_experts", "n_shared_experts", "first_k_dense_replace", "moe_layer_freq", "q_lora_rank",
    "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "_name_or_path",
)


@dataclass(frozen=True)
class MoE:
    """Mixture-of-experts sizes (None on an :class:`Architecture` means every layer is dense).

    Attributes:
        experts: routed experts per MoE layer.
        active: experts each token is sent to.
        expert_intermediate: hidden size of one expert's MLP.
        shared_intermediate: total hidden size of the always-on shared expert(s), 0 if none.
        shared_gate: whether the shared expert has a one-unit sigmoid gate (Qwen2-MoE).
        dense_layers: the first layers that are dense MLPs instead (DeepSeek ``first_k_dense_replace``).
        sparse_step: every how many layers is MoE (Qwen2-MoE ``decoder_sparse_step``).
    """

    experts: int
    active: int
    expert_intermediate: int
    shared_intermediate: int = 0
    shared_gate: bool = False
    dense_layers: int = 0
    sparse_step: int = 1

    def is_moe_layer(self, index: int) -> bool:
        return index >= self.dense_layers and (index + 1) % self.sparse_step == 0


@dataclass(frozen=True)
class MLA:
    """DeepSeek multi-head latent attention sizes (``q_lora_rank`` None: a plain q projection)."""

    q_lora_rank: Optional[int]
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class Architecture:
    """The shape of a decoder-only language model.

    Attributes:
        name: what the user called it (catalogue name, path or Hub id).
        model_type: the ``config.json`` ``model_type``.
        hidden: ``hidden_size``.
        intermediate: dense MLP hidden size.
        layers: decoder layers.
        heads: attention heads; ``kv_heads`` key/value heads; ``head_dim`` per head.
        vocab: vocabulary size (rows of the embedding and of the output layer).
        tied: whether the output layer shares the embedding's weight.
        qkv_bias: biases on the q, k, v projections (Qwen2).
        qk_norm: RMSNorm on q and k per head (Qwen3, Gemma 3).
        norms_per_layer: RMSNorms per decoder layer (2, or 4 for Gemma 2/3).
        fused: q/k/v in one projection and gate/up in another (Phi-3): same counts, other LoRA shapes.
        logit_softcap: Gemma 2's final logit soft-capping (extra logits-sized tensors).
        moe: mixture-of-experts sizes, None for a dense model.
        mla: DeepSeek latent attention sizes, None for ordinary attention.
        source: where the config came from (file, catalogue, Hub).
    """

    name: str
    model_type: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    qkv_bias: bool = False
    qk_norm: bool = False
    norms_per_layer: int = 2
    fused: bool = False
    logit_softcap: bool = False
    moe: Optional[MoE] = None
    mla: Optional[MLA] = None
    source: str = ""
    extra: Dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


def _need(cfg: Mapping[str, Any], key: str, where: str) -> int:
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError(f"config has no positive integer `{key}` (got {value!r}): cannot size the model", where)
    return value


def _text_config(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    """Multimodal configs (Gemma 3 4B+, Qwen2-VL) keep the language model under ``text_config``."""
    text = cfg.get("text_config")
    if isinstance(text, Mapping) and "hidden_size" in text:
        merged = dict(text)
        merged.setdefault("model_type", "gemma3_text" if cfg.get("model_type") == "gemma3" else cfg.get("model_type"))
        merged.setdefault("tie_word_embeddings", cfg.get("tie_word_embeddings", True))
        return merged
    return cfg


def _moe(cfg: Mapping[str, Any], model_type: str) -> Optional[MoE]:
    experts = cfg.get("num_experts") or cfg.get("num_local_experts")  # transformers 5 renames the former
    if model_type == "mixtral":
        return MoE(experts or 8, cfg.get("num_experts_per_tok", 2), cfg["intermediate_size"])
    if model_type in ("qwen2_moe", "qwen3_moe"):
        shared = cfg.get("shared_expert_intermediate_size", 0) or 0
        return MoE(experts or cfg["num_experts"], cfg.get("num_experts_per_tok", 8), cfg["moe_intermediate_size"],
                   shared,
                   shared_gate=model_type == "qwen2_moe", sparse_step=cfg.get("decoder_sparse_step", 1) or 1)
    if model_type in ("deepseek_v2", "deepseek_v3"):
        inter = cfg["moe_intermediate_size"]
        return MoE(cfg.get("n_routed_experts") or experts or cfg["n_routed_experts"],
                   cfg.get("num_experts_per_tok", 6), inter,
                   inter * (cfg.get("n_shared_experts") or 0), dense_layers=cfg.get("first_k_dense_replace", 0) or 0,
                   sparse_step=cfg.get("moe_layer_freq", 1) or 1)
    return None


def _mla(cfg: Mapping[str, Any], model_type: str) -> Optional[MLA]:
    if not model_type.startswith("deepseek_v"):
        return None
    return MLA(cfg.get("q_lora_rank"), cfg["kv_lora_rank"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"],
               cfg["v_head_dim"])


def from_config(cfg: Mapping[str, Any], name: str = "", source: str = "") -> Architecture:
    """The :class:`Architecture` of a ``config.json`` dict.

    Args:
        cfg: the parsed ``config.json``.
        name: what to call the model in output.
        source: where the config came from, for messages.

    Raises:
        InputError: an unsupported ``model_type`` or a missing size.
    """
    cfg = _text_config(cfg)
    where = source or name or "config.json"
    model_type = cfg.get("model_type")
    if model_type not in _FAMILIES:
        raise InputError(f"model_type {model_type!r} is not one zeropilot can size; supported: "
                         f"{', '.join(SUPPORTED_TYPES)}", where)
    hidden = _need(cfg, "hidden_size", where)
    heads = _need(cfg, "num_attention_heads", where)
    qkv_bias, qk_norm, norms, fused, _ = _FAMILIES[model_type]
    try:
        moe, mla = _moe(cfg, model_type), _mla(cfg, model_type)
    except (KeyError, TypeError) as exc:
        raise InputError(f"config lacks {exc} needed for a {model_type} model", where) from None
    return Architecture(
        name=name or str(cfg.get("_name_or_path") or model_type), model_type=model_type, hidden=hidden,
        intermediate=_need(cfg, "intermediate_size", where), layers=_need(cfg, "num_hidden_layers", where),
        heads=heads, kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or hidden // heads, vocab=_need(cfg, "vocab_size", where),
        tied=bool(cfg.get("tie_word_embeddings", model_type.startswith("gemma"))),
        qkv_bias=bool(cfg.get("attention_bias", qkv_bias)) if model_type != "qwen2" else True,
        qk_norm=qk_norm, norms_per_layer=norms, fused=fused,
        logit_softcap=bool(cfg.get("final_logit_softcapping")), moe=moe, mla=mla, source=source,
        extra={k: cfg[k] for k in ("max_position_embeddings", "sliding_window") if k in cfg},
    )

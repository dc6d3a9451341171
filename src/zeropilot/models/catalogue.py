"""Built-in ``config.json`` fields of common models, so ``zeropilot plan`` sizes them offline.

Keys are the Hub names in lower case without the organisation and without the ``-Instruct``/``-chat``/
``-it`` suffixes (instruction-tuned variants have the same shape). Values are the fields of each model's
published ``config.json`` that sizing needs. Totals are checked against the published parameter counts
and against transformers in ``tests/models``.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional


def _dense(model_type: str, h: int, i: int, layers: int, heads: int, kv: int, vocab: int, tied: bool,
           **extra: Any) -> Dict[str, Any]:
    return {"model_type": model_type, "hidden_size": h, "intermediate_size": i, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv, "vocab_size": vocab,
            "tie_word_embeddings": tied, **extra}


_Q2V = 151936
_Q2V7 = 152064
_GEMMA2 = dict(head_dim=256, final_logit_softcapping=30.0, attn_logit_softcapping=50.0)

CATALOGUE: Dict[str, Dict[str, Any]] = {
    # Qwen2 / Qwen2.5 (Qwen/Qwen2-7B, Qwen/Qwen2.5-7B-Instruct, ...)
    "qwen2-0.5b": _dense("qwen2", 896, 4864, 24, 14, 2, _Q2V, True),
    "qwen2-1.5b": _dense("qwen2", 1536, 8960, 28, 12, 2, _Q2V, True),
    "qwen2-7b": _dense("qwen2", 3584, 18944, 28, 28, 4, _Q2V7, False),
    "qwen2-72b": _dense("qwen2", 8192, 29568, 80, 64, 8, _Q2V7, False),
    "qwen2.5-0.5b": _dense("qwen2", 896, 4864, 24, 14, 2, _Q2V, True),
    "qwen2.5-1.5b": _dense("qwen2", 1536, 8960, 28, 12, 2, _Q2V, True),
    "qwen2.5-3b": _dense("qwen2", 2048, 11008, 36, 16, 2, _Q2V, True),
    "qwen2.5-7b": _dense("qwen2", 3584, 18944, 28, 28, 4, _Q2V7, False),
    "qwen2.5-14b": _dense("qwen2", 5120, 13824, 48, 40, 8, _Q2V7, False),
    "qwen2.5-32b": _dense("qwen2", 5120, 27648, 64, 40, 8, _Q2V7, False),
    "qwen2.5-72b": _dense("qwen2", 8192, 29568, 80, 64, 8, _Q2V7, False),
    # Qwen3
    "qwen3-0.6b": _dense("qwen3", 1024, 3072, 28, 16, 8, _Q2V, True, head_dim=128),
    "qwen3-1.7b": _dense("qwen3", 2048, 6144, 28, 16, 8, _Q2V, True, head_dim=128),
    "qwen3-4b": _dense("qwen3", 2560, 9728, 36, 32, 8, _Q2V, True, head_dim=128),
    "qwen3-8b": _dense("qwen3", 4096, 12288, 36, 32, 8, _Q2V, False, head_dim=128),
    "qwen3-14b": _dense("qwen3", 5120, 17408, 40, 40, 8, _Q2V, False, head_dim=128),
    "qwen3-32b": _dense("qwen3", 5120, 25600, 64, 64, 8, _Q2V, False, head_dim=128),
    "qwen3-30b-a3b": _dense("qwen3_moe", 2048, 6144, 48, 32, 4, _Q2V, False, head_dim=128, num_experts=128,
                            num_experts_per_tok=8, moe_intermediate_size=768),
    # Llama 3.x (meta-llama/Llama-3.1-8B-Instruct, ...)
    "llama-3-8b": _dense("llama", 4096, 14336, 32, 32, 8, 128256, False),
    "meta-llama-3-8b": _dense("llama", 4096, 14336, 32, 32, 8, 128256, False),
    "llama-3.1-8b": _dense("llama", 4096, 14336, 32, 32, 8, 128256, False),
    "meta-llama-3.1-8b": _dense("llama", 4096, 14336, 32, 32, 8, 128256, False),
    "llama-3.1-70b": _dense("llama", 8192, 28672, 80, 64, 8, 128256, False),
    "llama-3.2-1b": _dense("llama", 2048, 8192, 16, 32, 8, 128256, True, head_dim=64),
    "llama-3.2-3b": _dense("llama", 3072, 8192, 28, 24, 8, 128256, True, head_dim=128),
    "llama-3.3-70b": _dense("llama", 8192, 28672, 80, 64, 8, 128256, False),
    # Mistral / Mixtral
    "mistral-7b-v0.1": _dense("mistral", 4096, 14336, 32, 32, 8, 32000, False),
    "mistral-7b-v0.3": _dense("mistral", 4096, 14336, 32, 32, 8, 32768, False),
    "mistral-nemo-base-2407": _dense("mistral", 5120, 14336, 40, 32, 8, 131072, False, head_dim=128),
    "mixtral-8x7b-v0.1": _dense("mixtral", 4096, 14336, 32, 32, 8, 32000, False, num_local_experts=8,
                                num_experts_per_tok=2),
    # Gemma 2 / Gemma 3 (text part)
    "gemma-2-2b": _dense("gemma2", 2304, 9216, 26, 8, 4, 256000, True, **_GEMMA2),
    "gemma-2-9b": _dense("gemma2", 3584, 14336, 42, 16, 8, 256000, True, **_GEMMA2),
    "gemma-2-27b": _dense("gemma2", 4608, 36864, 46, 32, 16, 256000, True, **{**_GEMMA2, "head_dim": 128}),
    "gemma-3-1b": _dense("gemma3_text", 1152, 6912, 26, 4, 1, 262144, True, head_dim=256),
    "gemma-3-4b": _dense("gemma3_text", 2560, 10240, 34, 8, 4, 262208, True, head_dim=256),
    "gemma-3-12b": _dense("gemma3_text", 3840, 15360, 48, 16, 8, 262208, True, head_dim=256),
    "gemma-3-27b": _dense("gemma3_text", 5376, 21504, 62, 32, 16, 262208, True, head_dim=128),
    # Phi-3
    "phi-3-mini-4k": _dense("phi3", 3072, 8192, 32, 32, 32, 32064, False),
    "phi-3-mini-128k": _dense("phi3", 3072, 8192, 32, 32, 32, 32064, False),
    "phi-3.5-mini": _dense("phi3", 3072, 8192, 32, 32, 32, 32064, False),
    "phi-3-medium-4k": _dense("phi3", 5120, 17920, 40, 40, 10, 32064, False),
    # DeepSeek MoE with latent attention
    "deepseek-v2-lite": _dense("deepseek_v2", 2048, 10944, 27, 16, 16, 102400, False, moe_intermediate_size=1408,
                               n_routed_experts=64, n_shared_experts=2, num_experts_per_tok=6,
                               first_k_dense_replace=1, q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128,
                               qk_rope_head_dim=64, v_head_dim=128),
}

_ALIASES = {"phi-3-mini": "phi-3-mini-4k", "mistral-7b": "mistral-7b-v0.3", "mixtral-8x7b": "mixtral-8x7b-v0.1",
            "mistral-nemo": "mistral-nemo-base-2407", "meta-llama-3.1-70b": "llama-3.1-70b"}
_SUFFIXES = re.compile(r"(-instruct|-chat|-it|-base|-hf|-pt)+$")


def normalise(name: str) -> str:
    """``Qwen/Qwen2.5-7B-Instruct`` -> ``qwen2.5-7b``: the catalogue key a Hub id or name maps to."""
    key = name.strip().rstrip("/").split("/")[-1].lower()
    key = _SUFFIXES.sub("", key)
    return _ALIASES.get(key, key)


def lookup(name: str) -> Optional[Dict[str, Any]]:
    """The catalogued ``config.json`` fields for a model name or Hub id, or None."""
    key = normalise(name)
    if key in CATALOGUE:
        return CATALOGUE[key]
    stripped = re.sub(r"-instruct-\d+$|-\d{4}$", "", key)
    return CATALOGUE.get(_ALIASES.get(stripped, stripped))


def names() -> List[str]:
    """Every catalogued name, sorted."""
    return sorted(CATALOGUE)

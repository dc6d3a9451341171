"""Write the probe specs of the plan benchmark's GPU runs (bench/plan/specs/*.jsonl).

Each spec carries its whole model config (the Hugging Face config.json fields of the named model),
so a run is reproducible from the spec alone. Usage: python bench/plan/make_specs.py
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

MODELS = {
    "qwen2.5-0.5b": {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                     "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
                     "tie_word_embeddings": True, "max_position_embeddings": 32768},
    "qwen2.5-1.5b": {"model_type": "qwen2", "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                     "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936,
                     "tie_word_embeddings": True, "max_position_embeddings": 32768},
    "qwen2.5-3b": {"model_type": "qwen2", "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
                   "num_attention_heads": 16, "num_key_value_heads": 2, "vocab_size": 151936,
                   "tie_word_embeddings": True, "max_position_embeddings": 32768},
    "qwen2.5-7b": {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                   "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
                   "tie_word_embeddings": False, "max_position_embeddings": 32768},
    "llama-3.2-1b": {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                     "tie_word_embeddings": True, "max_position_embeddings": 131072},
    "llama-3.2-3b": {"model_type": "llama", "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28,
                     "num_attention_heads": 24, "num_key_value_heads": 8, "vocab_size": 128256,
                     "tie_word_embeddings": True, "max_position_embeddings": 131072},
    # Architectures that are not in ../shared/calibration/measured_h200.jsonl:
    "llama-3.1-8b": {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                     "tie_word_embeddings": False, "max_position_embeddings": 131072},
    "gemma-2-2b": {"model_type": "gemma2", "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                   "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 256000,
                   "tie_word_embeddings": True, "max_position_embeddings": 8192, "sliding_window": 4096,
                   "query_pre_attn_scalar": 256, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0},
    "gemma-3-1b": {"model_type": "gemma3_text", "hidden_size": 1152, "intermediate_size": 6912, "num_hidden_layers": 26,
                   "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 262144,
                   "tie_word_embeddings": True, "max_position_embeddings": 32768, "sliding_window": 512,
                   "query_pre_attn_scalar": 256},
    "phi-3-mini": {"model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
                   "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32064,
                   "tie_word_embeddings": False, "max_position_embeddings": 4096,
                   "original_max_position_embeddings": 4096, "pad_token_id": 32000},
    "mistral-7b": {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                   "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32768,
                   "tie_word_embeddings": False, "max_position_embeddings": 32768, "sliding_window": None},
    "mistral-1b-shape": {"model_type": "mistral", "hidden_size": 2048, "intermediate_size": 5632,
                         "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4,
                         "vocab_size": 32000, "tie_word_embeddings": False, "max_position_embeddings": 4096,
                         "sliding_window": None},
    "qwen3-1.7b": {"model_type": "qwen3", "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
                   "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
                   "tie_word_embeddings": True, "max_position_embeddings": 40960},
    "qwen3-4b": {"model_type": "qwen3", "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
                 "tie_word_embeddings": True, "max_position_embeddings": 40960},
}


def spec(name: str, stage: int, mb: int, seq: int, **kw) -> dict:
    """One probe spec: the model config by name plus the launch settings."""
    return {"name": name, "model": MODELS[name], "stage": stage, "mb": mb, "seq": seq, **kw}


CALL1_SERIAL = [
    spec("gemma-2-2b", 2, 1, 1024, gc=True, lora=16),  # smoke
    spec("qwen2.5-7b", 3, 1, 1024, gc=True, lora=8),  # the seed's model and cutoff
    spec("qwen2.5-0.5b", 2, 4, 2048),
    spec("qwen2.5-1.5b", 1, 2, 2048, gc=True),
    spec("qwen2.5-1.5b", 3, 1, 4096, gc=True, overlap=True),
    spec("qwen2.5-7b", 2, 2, 1024, gc=True, lora=16),
    spec("qwen2.5-3b", 2, 1, 2048, gc=True, offload=True),
    spec("llama-3.2-1b", 2, 2, 4096, gc=True, lora=32),
    spec("llama-3.2-3b", 3, 4, 1024),
    spec("qwen2.5-1.5b", 2, 8, 512, attn="eager"),
    spec("qwen2.5-0.5b", 2, 2, 2048, alloc_conf="expandable_segments:True"),
    spec("gemma-2-2b", 2, 2, 2048, gc=True),
    spec("phi-3-mini", 2, 2, 2048, gc=True, lora=16),
    spec("phi-3-mini", 3, 1, 2048, gc=True),
    spec("mistral-7b", 3, 1, 2048, gc=True, lora=16),
    spec("mistral-1b-shape", 1, 4, 1024),
    spec("qwen3-1.7b", 2, 4, 1024),
    spec("qwen3-4b", 3, 2, 2048, gc=True, lora=32),
    spec("gemma-3-1b", 2, 4, 1024, gc=True),
    spec("llama-3.1-8b", 3, 2, 2048, gc=True, lora=16),
    spec("qwen3-1.7b", 2, 1, 1024, save=True),
    spec("qwen2.5-1.5b", 3, 1, 1024, lora=16, save=True),
    spec("qwen2.5-1.5b", 3, 1, 1024, lora=16, save=True, exclude_frozen=True),
]

CALL1_PARALLEL = [
    spec("qwen2.5-3b", 3, 1, 2048, gc=True, lora=64, cap_gib=16),
    spec("llama-3.2-3b", 2, 2, 2048, gc=True, lora=16, cap_gib=16),
    spec("llama-3.2-3b", 2, 4, 2048, gc=True, lora=16, cap_gib=16),
    spec("qwen2.5-1.5b", 2, 1, 1024, gc=True, cap_gib=24),
    spec("qwen2.5-1.5b", 2, 1, 1024, gc=True, offload=True, cap_gib=16),
    spec("qwen2.5-0.5b", 2, 2, 1024, cap_gib=16),
    spec("qwen2.5-0.5b", 2, 8, 1024, cap_gib=16),
    spec("gemma-2-2b", 2, 2, 2048, gc=True, lora=16, cap_gib=16),
    spec("phi-3-mini", 2, 1, 2048, lora=16, cap_gib=16),
    spec("qwen3-4b", 2, 4, 2048, gc=True, lora=16, cap_gib=24),
    spec("qwen2.5-7b", 3, 1, 1024, gc=True, lora=8, cap_gib=16),
    spec("llama-3.2-1b", 2, 1, 2048, gc=True, cap_gib=24),
]


# Second call: architectures the calibration file lacks first, then saves, ZeRO-3 offload, more caps.
CALL2 = [
    spec("phi-3-mini", 2, 2, 2048, gc=True, lora=16),
    spec("gemma-2-2b", 2, 2, 2048, gc=True),
    spec("mistral-7b", 3, 1, 2048, gc=True, lora=16),
    spec("qwen3-1.7b", 2, 4, 1024),
    spec("gemma-3-1b", 2, 4, 1024, gc=True),
    spec("llama-3.1-8b", 3, 2, 2048, gc=True, lora=16),
    spec("qwen3-4b", 3, 2, 2048, gc=True, lora=32),
    spec("mistral-1b-shape", 1, 4, 1024),
    spec("phi-3-mini", 3, 1, 2048, gc=True),
    spec("gemma-3-1b", 3, 2, 2048, lora=16, overlap=True),
    spec("mistral-1b-shape", 2, 2, 2048, gc=True, offload=True),
    spec("gemma-2-2b", 3, 1, 4096, lora=16),
    spec("phi-3-mini", 2, 4, 1024, lora=8, attn="eager"),
    spec("qwen3-1.7b", 2, 1, 1024, save=True),
    spec("qwen2.5-1.5b", 3, 1, 1024, lora=16, save=True),
    spec("qwen2.5-1.5b", 3, 1, 1024, lora=16, save=True, exclude_frozen=True),
    spec("qwen2.5-1.5b", 2, 1, 1024, lora=16, save=True),
    spec("qwen2.5-3b", 3, 1, 2048, gc=True, offload=True, offload_param=True),
    spec("llama-3.2-1b", 2, 4, 2048, alloc_conf="expandable_segments:True"),
    spec("qwen2.5-7b", 3, 1, 1024, gc=True, lora=8, offload_param=True, cap_gib=16),
    spec("qwen3-1.7b", 2, 2, 2048, gc=True, lora=16, cap_gib=16),
    spec("mistral-7b", 2, 1, 1024, gc=True, lora=8, cap_gib=16),
    spec("gemma-3-1b", 2, 1, 1024, gc=True, cap_gib=16),
    spec("phi-3-mini", 2, 1, 1024, gc=True, lora=16, cap_gib=16),
    spec("llama-3.1-8b", 3, 1, 1024, gc=True, lora=16, cap_gib=24),
    spec("qwen2.5-1.5b", 2, 1, 1024, gc=True, offload=True, cap_gib=24),
]


def with_prediction(specs: list) -> list:
    """Each spec with ``pred_gib``: the plan's peak, which the parallel runner packs the GPU by."""
    sys.path.insert(0, str(HERE))
    from rows import spec_inputs

    from zeropilot.memory.gpu import estimate_gpu

    out = []
    for s in specs:
        pred = estimate_gpu(spec_inputs(s, 139.8)).peak_bytes / 1024**3
        out.append({**s, "pred_gib": round(min(pred, s.get("cap_gib") or pred), 1)})
    return out


def write(name: str, specs: list) -> None:
    path = HERE / "specs" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text("".join(json.dumps(s) + "\n" for s in specs))


if __name__ == "__main__":
    write("call1_serial.jsonl", CALL1_SERIAL)
    write("call1_parallel.jsonl", CALL1_PARALLEL)
    write("call2.jsonl", with_prediction(CALL2))

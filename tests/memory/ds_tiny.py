"""What the one-rank DeepSpeed witness workers of this folder share: a CPU rank on gloo and a tiny Qwen2 config.

The workers run as scripts (``python tests/memory/ds_*_worker.py PORT``), so this module is imported from their own
folder; it imports torch, DeepSpeed and transformers only when called.
"""


def one_cpu_rank(port: str):
    """Rank 0 of a world of 1 on gloo at ``port`` (DeepSpeed's CPU accelerator, one thread): ``(deepspeed, torch,
    AutoModelForCausalLM, config)`` with the config a tiny Qwen2 (2 layers, hidden 64, vocabulary 512)."""
    import os

    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                      DS_ACCELERATOR="cpu")
    import deepspeed
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    cfg = AutoConfig.for_model("qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, vocab_size=512)
    return deepspeed, torch, AutoModelForCausalLM, cfg

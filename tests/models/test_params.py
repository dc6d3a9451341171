"""Parameter counts and all-linear LoRA counts from config.json, checked against transformers and PEFT.

Models are built on the meta device (no memory, no weights): tiny but structurally faithful configs of
every supported family, and every catalogue entry with its real widths and two layers.
"""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from zeropilot.models import CATALOGUE, count_params, from_config, lora_trainable  # noqa: E402

BASE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=100, pad_token_id=0, bos_token_id=1, eos_token_id=2)
MLA = dict(kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, num_key_value_heads=4,
           moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=1)
FAMILIES = {
    "llama": {}, "llama-tied": dict(tie_word_embeddings=True), "mistral": {}, "qwen2": {},
    "qwen3": dict(head_dim=24), "gemma2": dict(head_dim=24), "gemma3_text": dict(head_dim=24), "phi3": {},
    "mixtral": dict(num_local_experts=4),
    "qwen3_moe": dict(moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2, head_dim=16),
    "qwen2_moe": dict(moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=4,
                      num_experts_per_tok=2),
    "deepseek_v2": dict(MLA, n_shared_experts=2, q_lora_rank=None),
    "deepseek_v3": dict(MLA, n_shared_experts=1, q_lora_rank=24, n_group=2, topk_group=1),
}


def _meta_model(model_type, **kw):
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(model_type, **kw)
    with torch.device("meta"):
        return cfg, AutoModelForCausalLM.from_config(cfg)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_counts_match_transformers_and_peft(family):
    cfg, model = _meta_model(family.split("-")[0], **{**BASE, **FAMILIES[family]})
    arch = from_config(cfg.to_dict(), family)
    counts = count_params(arch)
    assert counts.total == sum(p.numel() for p in model.parameters())
    assert counts.largest == max(p.numel() for p in model.parameters())
    lora = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM"))
    assert lora_trainable(arch, 4) == sum(p.numel() for p in lora.parameters() if p.requires_grad)


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_catalogue_configs_build_in_transformers_with_the_same_count(name):
    """Every catalogue entry at its real widths (two layers, to stay cheap) counts as transformers does."""
    fields = dict(CATALOGUE[name], num_hidden_layers=2)
    model_type = fields.pop("model_type")
    if model_type.startswith("deepseek"):
        fields["first_k_dense_replace"] = 1
    _, model = _meta_model(model_type, **fields)
    arch = from_config({"model_type": model_type, **fields}, name)
    assert count_params(arch).total == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name,billions", [("qwen2.5-7b", 7.62), ("llama-3.1-8b", 8.03), ("mistral-7b-v0.3", 7.25),
                                           ("gemma-2-2b", 2.61), ("phi-3-mini-4k", 3.82), ("qwen3-4b", 4.02),
                                           ("mixtral-8x7b-v0.1", 46.70), ("deepseek-v2-lite", 15.71)])
def test_catalogue_totals_match_published_model_cards(name, billions):
    assert round(count_params(from_config(CATALOGUE[name], name)).total / 1e9, 2) == billions


def test_moe_active_parameters_are_fewer_than_total():
    counts = count_params(from_config(CATALOGUE["qwen3-30b-a3b"], "q"))
    assert round(counts.active / 1e9, 1) == 3.4 and round(counts.total / 1e9, 1) == 30.5

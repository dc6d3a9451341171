"""Witnesses, on the installed torch, transformers and PEFT (CPU), of what the plan says about the activations of
freeze tuning and of LoRA on named modules: what autograd saves for the backward, counted with
``torch.autograd.graph.saved_tensors_hooks`` (each storage once, parameters left out)."""

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

from zeropilot.memory.gpu import lora_fp32_inputs  # noqa: E402
from zeropilot.memory.inputs import Freeze, PlanInputs  # noqa: E402
from zeropilot.memory.plan import unmodelled  # noqa: E402
from zeropilot.memory.tuning import first_saving_layer  # noqa: E402
from zeropilot.models import from_config  # noqa: E402
from zeropilot.models.trainable import freeze_trainable  # noqa: E402

MB, SEQ = 2, 64
CFG = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, vocab_size=300,
           pad_token_id=0)


def _model(layers, model_type="llama"):
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(model_type, num_hidden_layers=layers, **CFG)
    torch.manual_seed(0)
    return cfg, AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")


def _saved(model, only_fp32=False) -> int:
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params and (t.dtype == torch.float32 or not only_fp32):
            seen[st.data_ptr()] = max(seen.get(st.data_ptr(), 0), st.nbytes())
        return t

    x = torch.randint(0, CFG["vocab_size"], (MB, SEQ))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=x, labels=x)
    return sum(seen.values())


def _freeze(layers, trainable_layers):
    """A model with LLaMA-Factory's freeze tuning applied (the parameters zeropilot says train, by name)."""
    cfg, model = _model(layers)
    arch = from_config(cfg.to_dict(), "llama")
    train = {p.name for p in freeze_trainable(arch, trainable_layers)}
    for name, p in model.named_parameters():
        p.requires_grad_(name in train)
    return arch, model


def test_frozen_layers_before_the_first_trainable_one_save_nothing():
    full = {n: _saved(_model(n)[1]) for n in (2, 4)}
    assert full[4] > full[2]  # every trained layer keeps tensors for the backward
    arch4, last4 = _freeze(4, 1)
    _, last2 = _freeze(2, 1)
    assert _saved(last4) == _saved(last2)  # two more frozen layers in front: nothing more saved
    assert first_saving_layer(PlanInputs(arch4, freeze=Freeze(1))) == 3
    first4, first2 = _freeze(4, -1)[1], _freeze(2, -1)[1]
    # frozen layers after a trainable one keep tensors for the input's gradient, but not those only the weights'
    # gradients need: the plan counts them as trained layers (high) and says so without checkpointing
    assert 0 < _saved(first4) - _saved(first2) < full[4] - full[2]
    inputs = PlanInputs(arch4, freeze=Freeze(-1))
    assert first_saving_layer(inputs) == 0
    assert any("freeze" in setting for setting, _ in unmodelled(inputs))
    assert not unmodelled(PlanInputs(arch4, freeze=Freeze(1), gradient_checkpointing=True))


@pytest.mark.parametrize("targets", [("q_proj", "v_proj"), ("o_proj", "down_proj"), ("gate_proj", "up_proj")])
def test_lora_fp32_input_copies_only_where_adapters_sit(targets):
    """PEFT keeps adapters in fp32 on a bf16 model and saves each wrapped layer's fp32 input copy: the plan counts it
    (ZeRO-3 in zero.Init, where DeepSpeed leaves the adapters fp32) only for the wrapped layers."""
    per_layer = []
    for layers in (2, 4):
        cfg, model = _model(layers)
        base = _saved(model, only_fp32=True)
        wrapped = peft.get_peft_model(model, peft.LoraConfig(r=8, target_modules=list(targets), task_type="CAUSAL_LM"))
        per_layer.append(_saved(wrapped, only_fp32=True) - base)
    measured = (per_layer[1] - per_layer[0]) / 2 / (MB * SEQ)
    arch = from_config(cfg.to_dict(), "llama")
    planned = lora_fp32_inputs(PlanInputs(arch, stage=3, zero_init=True, lora_rank=8, lora_targets=targets))
    assert measured == planned

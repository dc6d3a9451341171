"""Parameter names and trainable sets (LoRA on named modules, modules_to_save, freeze tuning) against transformers,
PEFT and LLaMA-Factory's own matching code, on the meta device."""

import re

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

from tests.models.test_params import BASE, FAMILIES, _meta_model  # noqa: E402
from zeropilot.models import from_config, lora_trainable  # noqa: E402
from zeropilot.models.trainable import (first_trainable_layer, freeze_layer_ids, freeze_trainable,  # noqa: E402
                                        lora_params, named_parameters, saved_modules)


def _arch(family):
    cfg, model = _meta_model(family.split("-")[0], **{**BASE, **FAMILIES[family]})
    return from_config(cfg.to_dict(), family), model


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_names_and_sizes_match_transformers(family):
    arch, model = _arch(family)
    assert {(p.name, p.numel) for p in named_parameters(arch)} == {(n, t.numel()) for n, t in model.named_parameters()}
    linears = {n + ".weight" for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"}
    assert {p.name for p in named_parameters(arch) if p.linear is not None and p.layer is not None} == linears


def _peft_trainable(model, **kw):
    wrapped = peft.get_peft_model(model, peft.LoraConfig(task_type="CAUSAL_LM", **kw))
    return sum(p.numel() for p in wrapped.parameters() if p.requires_grad)


@pytest.mark.parametrize("family", ["llama", "qwen2", "phi3", "gemma2", "qwen2_moe", "deepseek_v2"])
def test_lora_on_named_modules_counts_as_peft(family):
    arch, model = _arch(family)
    # PEFT rewrites MLP targets of MoE families onto their fused expert tensors: those are named as not modelled
    targets = ["qkv_proj"] if family == "phi3" else ["o_proj"] if "_moe" in family or "deepseek" in family else [
        "o_proj", "up_proj"]
    assert lora_params(arch, 4, targets) == _peft_trainable(model, r=4, target_modules=targets)


def test_all_linear_agrees_with_the_older_count():
    for family in FAMILIES:
        arch, _ = _arch(family)
        assert lora_params(arch, 8) == lora_trainable(arch, 8), family


def test_regex_targets_rank_pattern_and_dora_count_as_peft():
    arch, model = _arch("llama")
    regex = r".*\.(q_proj|v_proj)"
    assert lora_params(arch, 4, regex) == _peft_trainable(model, r=4, target_modules=regex)
    _, model = _arch("llama")
    pattern = {"v_proj": 16, r"layers\.0\.self_attn\.q_proj": 2}
    assert lora_params(arch, 4, ["q_proj", "v_proj"], pattern) == _peft_trainable(
        model, r=4, target_modules=["q_proj", "v_proj"], rank_pattern=pattern)
    _, model = _arch("llama")
    assert lora_params(arch, 4, ["q_proj", "v_proj"], dora=True) == _peft_trainable(
        model, r=4, target_modules=["q_proj", "v_proj"], use_dora=True)


@pytest.mark.parametrize("family", ["llama", "llama-tied", "qwen2"])
def test_modules_to_save_are_full_trainable_copies(family):
    arch, model = _arch(family)
    saved = ["embed_tokens", "lm_head"]
    peft_total = _peft_trainable(model, r=4, target_modules=["q_proj"], modules_to_save=saved)
    assert lora_params(arch, 4, ["q_proj"]) + sum(p.numel for p in saved_modules(arch, saved)) == peft_total


def _llamafactory_freeze(model, num_layers, trainable_layers, modules, extra, llama_pro=False):
    """LLaMA-Factory v0.9.5 ``model/adapter.py`` ``_setup_freeze_tuning``, its matching lines verbatim (the library
    is not installed here: it pins its own transformers), applied to the real module names."""
    if llama_pro:
        stride = num_layers // trainable_layers
        trainable_layer_ids = range(stride - 1, num_layers + stride - 1, stride)
    elif trainable_layers > 0:
        trainable_layer_ids = range(max(0, num_layers - trainable_layers), num_layers)
    else:
        trainable_layer_ids = range(min(-trainable_layers, num_layers))
    trainable_layers_ = []
    for module_name in modules:
        for idx in trainable_layer_ids:
            trainable_layers_.append(".{:d}.{}".format(idx, module_name if module_name != "all" else ""))
    for module_name in extra:
        trainable_layers_.append(module_name)
    return sum(p.numel() for n, p in model.named_parameters() if any(t in n for t in trainable_layers_))


@pytest.mark.parametrize("family,layers,modules,extra,pro", [
    ("llama", 2, ["all"], [], False), ("llama", -1, ["mlp"], [], False), ("qwen2", 1, ["self_attn"], ["norm"], False),
    ("llama", 3, ["all"], ["embed_tokens", "lm_head"], False), ("llama-tied", 1, ["all"], ["lm_head"], False),
    ("qwen3_moe", 2, ["mlp"], [], False), ("llama", 1, ["all"], [], True), ("phi3", 5, ["all"], [], False)])
def test_freeze_trains_what_llamafactory_trains(family, layers, modules, extra, pro):
    arch, model = _arch(family)
    ours = sum(p.numel for p in freeze_trainable(arch, layers, modules, extra, pro))
    assert ours == _llamafactory_freeze(model, arch.layers, layers, modules, extra, pro)


def test_freeze_layer_ids_and_first_trainable_layer():
    assert freeze_layer_ids(32, 2) == [30, 31]
    assert freeze_layer_ids(32, -3) == [0, 1, 2]
    assert freeze_layer_ids(32, 4, llama_pro=True) == [7, 15, 23, 31]
    assert freeze_layer_ids(4, 9) == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        freeze_layer_ids(30, 4, llama_pro=True)
    arch, _ = _arch("llama")
    assert first_trainable_layer(arch, freeze_trainable(arch, 1)) == arch.layers - 1
    assert first_trainable_layer(arch, freeze_trainable(arch, 1, extra=["embed_tokens"])) == 0
    assert first_trainable_layer(arch, freeze_trainable(arch, 1, ["nothing_here"])) == arch.layers
    assert re.match(r"model\.layers\.\d+\.", freeze_trainable(arch, 1)[0].name)

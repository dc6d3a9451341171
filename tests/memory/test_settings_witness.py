"""Witnesses, on the installed torch, transformers and PEFT (CPU), of what the plan says about the activations of
freeze tuning and of LoRA on named modules: what autograd saves for the backward, counted with
``torch.autograd.graph.saved_tensors_hooks`` (each storage once, parameters left out)."""

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

from zeropilot.memory.gpu import lora_fp32_inputs  # noqa: E402
from zeropilot.memory.inputs import Freeze, PlanInputs  # noqa: E402
from zeropilot.memory.plan import unmodelled  # noqa: E402
from zeropilot.memory.tuning import first_backward_layer, first_saving_layer  # noqa: E402
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


def test_without_checkpointing_the_output_holds_each_layers_key_value_copies():
    """``PlanInputs.kv_cache`` (``memory.gpu._with_cache``): a causal LM called as a script calls it (no
    ``use_cache=False``) returns a ``DynamicCache`` with each layer's key and value, kv-sized; the attention saved the
    trained layer's for its backward, while the frozen layers' are held by the output alone. Gradient checkpointing
    turns the cache off, and transformers 5's ``TrainingArguments`` leave it off by default."""
    import dataclasses

    from transformers import TrainingArguments

    arch, model = _freeze(3, 1)
    model.train()
    saved = set()

    def pack(t):
        saved.add(t.untyped_storage().data_ptr())
        return t

    x = torch.randint(0, CFG["vocab_size"], (MB, SEQ))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(input_ids=x, labels=x)
    pairs = [(layer.keys, layer.values) for layer in out["cache"].layers]
    kv = MB * SEQ * arch.kv_heads * arch.head_dim * 2
    assert len(pairs) == 3 and all(t.untyped_storage().nbytes() == kv for pair in pairs for t in pair)
    assert [all(t.untyped_storage().data_ptr() in saved for t in pair) for pair in pairs] == [False, False, True]
    assert not PlanInputs(arch).kv_cache
    assert {f.name: f.default for f in dataclasses.fields(TrainingArguments)}["use_cache"] is False
    model.gradient_checkpointing_enable()
    assert "cache" not in model(input_ids=x, labels=x)

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


@pytest.mark.slow
def test_a_quantized_model_is_built_outside_zero_init_so_lora_keeps_no_fp32_input_copies(tmp_path):
    """transformers builds a ZeRO-3 model in zero.Init unless it is quantized (one rank, gloo, a registered no-op
    quantizer: the decision is ``is_quantized``'s alone). Outside zero.Init DeepSpeed casts LoRA's adapters to 16
    bits, so the plan counts no fp32 input copies for QLoRA and sizes its ZeRO-3 build as a model built outside."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tests.runjobs import free_port
    from tests.zp import extensions_dir

    worker = Path(__file__).with_name("zero3_quantized_worker.py")
    env = dict(os.environ, DS_ACCELERATOR="cpu", TORCH_EXTENSIONS_DIR=extensions_dir(tmp_path / "ext"))
    done = subprocess.run([sys.executable, str(worker), str(tmp_path / "ckpt"), str(free_port())], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"plain": True, "quantized": False}
    cfg, _ = _model(2)
    arch = from_config(cfg.to_dict(), "llama")
    qlora = PlanInputs(arch, stage=3, zero_init=True, lora_rank=8, quant_bits=4)
    assert not qlora.zero_init and "outside zero.Init" in qlora.sources["zero_init"]
    assert lora_fp32_inputs(qlora) == 0 < lora_fp32_inputs(PlanInputs(arch, stage=3, zero_init=True, lora_rank=8))


def test_a_quantized_model_loads_onto_the_gpu_so_the_host_holds_one_tensor_at_a_time(monkeypatch):
    """transformers' bitsandbytes quantizers (4- and 8-bit) give a load with no device map the current GPU's, so
    ``from_pretrained`` sends each tensor to the GPU as it reads it: the plan's host figure for loading a quantized
    model is one 16-bit tensor per rank, not the whole model."""
    import torch
    from transformers import BitsAndBytesConfig
    from transformers.quantizers.auto import AutoHfQuantizer

    from zeropilot.memory.host import estimate_host
    from zeropilot.models.params import count_params

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the decision as it runs on a GPU machine
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    for config in (BitsAndBytesConfig(load_in_4bit=True), BitsAndBytesConfig(load_in_8bit=True)):
        assert AutoHfQuantizer.from_config(config).update_device_map(None) == {"": 3}
    cfg, _ = _model(2)
    arch = from_config(cfg.to_dict(), "llama")
    counts = count_params(arch)
    plain = estimate_host(PlanInputs(arch, stage=2, lora_rank=8), counts.total, 0)
    quantized = estimate_host(PlanInputs(arch, stage=2, lora_rank=8, quant_bits=4), counts.total, 0)
    assert plain.load_peak_per_node_bytes == 2 * counts.total
    assert quantized.load_peak_per_node_bytes == 2 * counts.largest < plain.load_peak_per_node_bytes
    assert "tensor by tensor" in quantized.reason


def test_under_checkpointing_frozen_front_layers_keep_their_input_and_run_again():
    """``gradient_checkpointing_enable`` (as the HF Trainer and the probe call it) also calls
    ``enable_input_require_grads`` for a causal LM, so with freeze tuning the embedding's output needs a gradient: the
    frozen layers before the first trainable one are checkpointed like the others, each keeping its input and running
    its forward again in the backward (issue 40's traces ``c6_x_q3_freeze4_z3_gc`` and ``next_x_q7_freeze4_z3_gc``).
    The expandable replay takes every layer as saving (``gpu.replay_front``)."""
    from dataclasses import replace

    from zeropilot.memory.gpu import replay_front

    arch, model = _freeze(4, 1)
    model.train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    needs_grad, runs = [], {}
    model.model.embed_tokens.register_forward_hook(lambda m, args, out: needs_grad.append(out.requires_grad))
    for i, layer in enumerate(model.model.layers):
        layer.mlp.register_forward_pre_hook(lambda m, args, i=i: runs.__setitem__(i, runs.get(i, 0) + 1))
    x = torch.randint(0, CFG["vocab_size"], (MB, SEQ))
    model(input_ids=x, labels=x).loss.backward()
    assert needs_grad == [True]  # the embedding's output needs a gradient, so each layer's input does
    assert runs == {0: 2, 1: 2, 2: 2, 3: 2}  # and every layer, the three frozen ones too, runs again in the backward
    inputs = PlanInputs(arch, freeze=Freeze(1), gradient_checkpointing=True)
    assert first_saving_layer(inputs) == 3  # what the default allocator's replay still takes
    assert first_backward_layer(inputs) == 0  # what the time model and the expandable replay take
    assert replay_front(replace(inputs, expandable_segments=True)) == 0

"""export against DeepSpeed's own zero_to_fp32 and against the trained model's logits."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import torch
from safetensors.torch import load_file

from zeropilot.checkpoint.export import ExportOptions, export_checkpoint

from zeropilot.checkpoint.layout import read_layout
from zeropilot.checkpoint.reconstruct import open_checkpoint

from .conftest import FULL, LORA, SPECS

pytestmark = pytest.mark.slow

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def _deepspeed_fp32(path):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return get_fp32_state_dict_from_zero_checkpoint(str(path))


def _plain_model(config_dir, state, dtype):
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(config_dir)), dtype=dtype)
    model.load_state_dict(state, strict=False)
    model.tie_weights()
    return model.eval()


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.parametrize("name", FULL)
def test_fp32_export_equals_zero_to_fp32_tensor_for_tensor(checkpoints, tmp_path, name):
    built = checkpoints(name)
    result = export_checkpoint(built.path, tmp_path / "out", ExportOptions(dtype="fp32", progress=False))
    ours = load_file(str(tmp_path / "out" / "model.safetensors"))
    theirs = _deepspeed_fp32(built.save_dir)
    aliases = {a: t for a, t in [("lm_head.weight", "model.embed_tokens.weight")] if SPECS[name]["tied"]}
    assert set(ours) | set(aliases) == set(theirs)
    for key, tensor in theirs.items():
        got = ours[aliases.get(key, key)]
        assert got.dtype == torch.float32
        assert torch.equal(got, tensor.float()), key
    assert result.dropped_tied == list(aliases)


@pytest.mark.parametrize("name", LORA)
def test_lora_runs_every_tensor_equals_zero_to_fp32(checkpoints, name):
    """Trainable LoRA weights (fp32 partitions) and frozen base fragments (ZeRO-2 whole, ZeRO-3 cut per rank)."""
    built = checkpoints(name)
    state = open_checkpoint(read_layout(built.path))
    theirs = _deepspeed_fp32(built.save_dir)
    ours = {e.name: state.read(e) for e in state.entries}
    # DeepSpeed adds a tied alias only when its target was saved (not with exclude_frozen_parameters).
    assert set(ours) | {a for a, t in state.aliases.items() if t in ours} == set(theirs)
    for key, tensor in ours.items():
        assert tensor.dtype == theirs[key].dtype and torch.equal(tensor, theirs[key]), key
    frozen = [e for e in state.entries if e.source == "frozen"]
    assert bool(frozen) == (not SPECS[name].get("exclude_frozen") and not SPECS[name].get("trainer"))


@pytest.mark.parametrize("name", FULL)
def test_export_loads_with_from_pretrained_and_gives_the_trained_logits(checkpoints, tmp_path, name):
    from transformers import AutoModelForCausalLM

    built = checkpoints(name)
    dtype = DTYPES[SPECS[name]["dtype"]]
    export_checkpoint(built.path, tmp_path / "out", ExportOptions(progress=False))  # default: training dtype
    ref = built.reference()
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
    assert loaded.dtype == dtype
    for key, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, ref["state"][key]), key
    if SPECS[name]["tied"]:
        assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    trained = _plain_model(built.save_dir, ref["state"], dtype)
    assert torch.equal(_logits(loaded, ref["input_ids"]), _logits(trained, ref["input_ids"]))
    # The DeepSpeed engine's own forward (ZeRO-3 computes in another order: close, not bitwise).
    torch.testing.assert_close(_logits(loaded, ref["input_ids"]), ref["logits"], rtol=2e-2, atol=2e-2)


def test_sharded_export_writes_an_index_transformers_loads(checkpoints, tmp_path):
    from transformers import AutoModelForCausalLM

    built = checkpoints("z3_w3_fp32")
    result = export_checkpoint(built.path, tmp_path / "out", ExportOptions(max_shard_size="100KB", progress=False))
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    assert len(result.files) > 3 and set(index["weight_map"].values()) == set(result.files[:-1])
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"))
    ref = built.reference()
    for key, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, ref["state"][key]), key


def test_zero_to_fp32_shards_of_zero2_each_hold_the_whole_model_ours_do_not(checkpoints, tmp_path):
    """Witness for docs/ckpt.md (Performance): DeepSpeed's zero_to_fp32 (0.19.8) writes ZeRO-1/2 shards as views of one
    torch.cat, and torch.save keeps whole storages, so every shard file holds the whole fp32 vector."""
    import subprocess
    import sys

    built = checkpoints("z2_w2_bf16_tied")
    fp32_bytes = sum(t.numel() * 4 for k, t in _deepspeed_fp32(built.save_dir).items() if k != "lm_head.weight")
    proc = subprocess.run([sys.executable, str(built.path / "zero_to_fp32.py"), str(built.path), str(tmp_path / "ds"),
                           "--max_shard_size", "100KB"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    theirs = sorted((tmp_path / "ds").glob("pytorch_model-*.bin"))
    assert len(theirs) >= 3
    assert all(f.stat().st_size >= fp32_bytes for f in theirs)  # each shard: the whole model, at least
    export_checkpoint(built.path, tmp_path / "zp", ExportOptions(dtype="fp32", max_shard_size="100KB", progress=False))
    ours = list((tmp_path / "zp").glob("model-*.safetensors"))
    assert len(ours) >= 3
    assert fp32_bytes <= sum(f.stat().st_size for f in ours) < fp32_bytes + 4096 * len(ours)


def test_lora_adapter_only_export_loads_with_peft(checkpoints, tmp_path):
    from peft import PeftModel

    built = checkpoints("z3_w2_fp32_lora_excl")
    ref = built.reference()
    out = tmp_path / "adapter"
    result = export_checkpoint(built.path, out, ExportOptions(adapter_only=True, progress=False))
    assert sorted(p.name for p in out.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert result.tensors == 8
    base_state = {k.replace("base_model.model.", "").replace(".base_layer.", "."): v
                  for k, v in ref["state"].items() if "lora_" not in k}
    base = _plain_model(built.path, base_state, torch.float32)
    model = PeftModel.from_pretrained(base, str(out)).eval()
    for key, tensor in model.state_dict().items():
        assert torch.equal(tensor, ref["state"][key]), key
    torch.testing.assert_close(_logits(model, ref["input_ids"]), ref["logits"], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["z2_w3_bf16_lora_frozen", "z3_w3_bf16_lora_frozen"])
def test_lora_with_frozen_base_exports_a_merged_model(checkpoints, tmp_path, name):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    built = checkpoints(name)
    ref = built.reference()
    result = export_checkpoint(built.path, tmp_path / "merged", ExportOptions(dtype="fp32", progress=False))
    assert result.product == "merged-model"
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged")).eval()
    peft_model = get_peft_model(
        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(built.path)), dtype=torch.float32),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    peft_model.load_state_dict({k: v.float() for k, v in ref["state"].items()})
    expected = peft_model.merge_and_unload().eval()
    for key, tensor in expected.state_dict().items():
        torch.testing.assert_close(merged.state_dict()[key], tensor, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(_logits(merged, ref["input_ids"]), ref["logits"].float(), rtol=5e-2, atol=5e-2)


def test_merge_into_a_base_model_folder(checkpoints, tmp_path):
    from transformers import AutoModelForCausalLM

    built = checkpoints("z3_w2_fp32_lora_excl")
    ref = built.reference()
    base_state = {k.replace("base_model.model.", "").replace(".base_layer.", "."): v
                  for k, v in ref["state"].items() if "lora_" not in k}
    _plain_model(built.path, base_state, torch.float32).save_pretrained(str(tmp_path / "base"))
    export_checkpoint(built.path, tmp_path / "merged", ExportOptions(merge_into=tmp_path / "base", progress=False))
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged")).eval()
    torch.testing.assert_close(_logits(merged, ref["input_ids"]), ref["logits"], rtol=1e-4, atol=1e-4)


def test_seed_layout_trainer_zero3_lora_gather_false(checkpoints, tmp_path):
    """HF Trainer + ZeRO-3 + LoRA + stage3_gather_16bit_weights_on_model_save false (the seed user)."""
    from safetensors import safe_open

    built = checkpoints("trainer_z3_lora")
    out = tmp_path / "adapter"
    export_checkpoint(built.path, out, ExportOptions(adapter_only=True, dtype="fp32", progress=False))
    ref = built.reference()
    with safe_open(str(out / "adapter_model.safetensors"), framework="pt") as f:
        keys = list(f.keys())
        for key in keys:
            live = key.replace(".lora_A.", ".lora_A.default.").replace(".lora_B.", ".lora_B.default.")
            assert torch.equal(f.get_tensor(key), ref["state"][live].float()), key
    assert len(keys) == 8

"""inspect's tensor facts against what was trained; verify against real exports."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from zeropilot.checkpoint.export import ExportOptions, export_checkpoint
from zeropilot.checkpoint.inspect import inspect_checkpoint, render_text, to_json
from zeropilot.checkpoint.verify import verify

from .conftest import FULL, SPECS

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", FULL + ["z2_w3_bf16_lora_frozen", "z3_w3_bf16_lora_frozen", "z3_w2_fp32_lora_excl"])
def test_inspect_counts_match_the_trained_module(checkpoints, name):
    built = checkpoints(name)
    ref = built.reference()["state"]
    report = inspect_checkpoint(built.path)
    assert report.verdict == "ok" and report.exit_code == 0
    facts = report.tensors
    lora = {k: v for k, v in ref.items() if "lora_" in k}
    spec = SPECS[name]
    tied = {"lm_head.weight", "base_model.model.lm_head.weight"} if spec["tied"] else set()
    total = sum(v.numel() for k, v in ref.items() if k not in tied)
    if spec.get("lora"):
        assert facts.trainable == sum(v.numel() for v in lora.values())
        assert facts.frozen == (0 if spec.get("exclude_frozen") else total - facts.trainable)
    else:
        assert facts.trainable == total and facts.frozen == 0
    for key, shape in facts.shapes.items():
        assert list(ref[key].shape) == shape
    assert facts.module_dtype == ("bfloat16" if spec["dtype"] == "bf16" and not spec.get("lora") else
                                  facts.module_dtype)
    text = render_text(report)
    assert f"ZeRO-{spec['stage']}" in text and f"world size: {spec['world']}" in text
    assert to_json(report)["tensors"]["parameters"] == facts.parameters
    if spec.get("lora") and not spec.get("exclude_frozen"):
        assert facts.frozen_bytes == facts.frozen * 2  # bf16 base stored in the checkpoint
        assert "frozen weights stored" in text


@pytest.mark.parametrize("name", ["z2_w2_bf16_tied", "z3_w3_fp32"])
def test_verify_passes_on_exports_and_catches_a_changed_tensor(checkpoints, tmp_path, name):
    built = checkpoints(name)
    out = tmp_path / "out"
    export_checkpoint(built.path, out, ExportOptions(progress=False))
    result = verify(out, built.path, load=True)
    assert result.ok and result.compared == len(load_file(str(out / "model.safetensors")))
    assert "all finite" in result.load
    tensors = load_file(str(out / "model.safetensors"))
    key = "model.norm.weight"
    tensors[key] = tensors[key].clone()
    tensors[key][0] += 1
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    bad = verify(out, built.path)
    assert not bad.ok and bad.mismatched == [key]


def test_verify_adapter_of_the_seed_layout(checkpoints, tmp_path):
    built = checkpoints("trainer_z3_lora")
    export_checkpoint(built.path, tmp_path / "a", ExportOptions(adapter_only=True, progress=False))
    result = verify(tmp_path / "a", built.path)
    assert result.ok and result.compared == 8


def test_inspect_reports_the_seed_layout(checkpoints):
    built = checkpoints("trainer_z3_lora")
    report = inspect_checkpoint(built.path)
    assert report.layout.kind == "hf-output-dir" and report.global_step == 2
    assert report.layout.is_peft and "trainer_state.json" in report.layout.hf_files
    assert report.tensors.trainable == sum(math.prod(s) for s in report.tensors.shapes.values())
    assert all("lora_" in k for k in report.tensors.shapes)
    assert "yes, on 2 data-parallel ranks as it is; on any number after `zeropilot ckpt universal`" in report.resume
    # the Trainer's DeepSpeed config: 2 samples per rank, 1 accumulation step, 2 ranks -> 4 per step
    on = report.resume_on
    assert (on.as_is, on.after_universal, on.global_batch, on.micro_batch) == ([2], "any", 4, 2)
    assert on.same_global_batch == [1, 2] and "gradient_accumulation_steps 2, 1" in report.resume
    assert torch.is_tensor(built.reference()["logits"])

"""A checkpoint written by DeepSpeed 0.14.4 (fixture, see tests/data/checkpoints/*/SOURCE.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from zeropilot.checkpoint import torchzip
from zeropilot.checkpoint.layout import read_layout

from .conftest import zeropilot

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "checkpoints" / "ds0.14.4_z2_w2_bf16"


def test_every_file_reads_without_the_torch_fallback():
    layout = read_layout(FIXTURE / "run")
    assert (layout.stage, layout.world_size, layout.ds_version) == (2, 2, "0.14.4")
    for f in layout.rank_files:
        assert isinstance(torchzip.load(f.path), dict)  # no Unsupported: its `set` is understood


def test_export_equals_deepspeed_0_14_4s_own_zero_to_fp32(tmp_path):
    result = zeropilot("ckpt", "export", FIXTURE / "run", tmp_path / "out", "--dtype", "fp32")
    assert result.returncode == 0, result.stderr
    ours = load_file(str(tmp_path / "out" / "model.safetensors"))
    theirs = load_file(str(FIXTURE / "zero_to_fp32_0.14.4.safetensors"))
    assert set(ours) | {"lm_head.weight"} == set(theirs)  # the tied copy is written once
    for key, tensor in theirs.items():
        assert torch.equal(ours["model.embed_tokens.weight" if key == "lm_head.weight" else key], tensor), key
    inspect = zeropilot("ckpt", "inspect", FIXTURE / "run")
    assert inspect.returncode == 0 and "written by DeepSpeed 0.14.4" in inspect.stdout


@pytest.mark.parametrize("dtype", ["bf16"])
def test_bf16_export_is_the_fp32_master_cast(tmp_path, dtype):
    result = zeropilot("ckpt", "export", FIXTURE / "run", tmp_path / "out", "--dtype", dtype)
    assert result.returncode == 0, result.stderr
    ours = load_file(str(tmp_path / "out" / "model.safetensors"))
    theirs = load_file(str(FIXTURE / "zero_to_fp32_0.14.4.safetensors"))
    for key, tensor in ours.items():
        assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, theirs[key].to(torch.bfloat16)), key

"""``ckpt universal`` against DeepSpeed's own ds_to_universal.py, and the torch.save archives it writes.

The checkpoints are the session's (``conftest.py``): ZeRO-1 on 1 rank, ZeRO-2 and ZeRO-3 on 2, LoRA with its frozen
base at ZeRO-2 and ZeRO-3 on 3 ranks, the HF Trainer's seed layout. DeepSpeed's converter runs once for all of them
in one child process (``--inject_missing_state``: plain models carry no ``universal_checkpoint_info``, without which
its ZeRO-1/2 path stops). Resuming on 1 and 3 ranks through DeepSpeed's loader is ``tests/repro``'s.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from tests.zp import extensions_dir, run_group
from zeropilot.checkpoint import torchzip, torchzip_writer
from zeropilot.checkpoint.inspect import inspect_checkpoint
from zeropilot.checkpoint.safe_load import LossScaler, ZeroStageEnum
from zeropilot.checkpoint.safetensors_writer import FileSpan
from zeropilot.checkpoint.universal import UniversalOptions, convert
from zeropilot.errors import InputError

pytestmark = pytest.mark.slow

AGAINST_DS = ["z1_w1_fp32", "z2_w2_bf16_tied", "z3_w2_bf16_tied", "z2_w3_bf16_lora_frozen", "z3_w3_bf16_lora_frozen"]

_DS_CONVERT = """
import argparse, contextlib, io, json, sys
from deepspeed.checkpoint import ds_to_universal
for src, dst in json.loads(sys.argv[1]):
    args = argparse.Namespace(input_folder=src, output_folder=dst, num_extract_workers=1, num_merge_workers=1,
                              keep_temp_folder=False, strict=True, inject_missing_state=True)
    with contextlib.redirect_stdout(io.StringIO()):
        ds_to_universal.main(args)
"""


@pytest.fixture(scope="module")
def converted(checkpoints, tmp_path_factory):
    """name -> (DeepSpeed's universal tag folder, ours), for every checkpoint of AGAINST_DS."""
    base = tmp_path_factory.mktemp("universal")
    pairs, out = [], {}
    (base / "zp").mkdir()
    for name in AGAINST_DS:
        built = checkpoints(name)
        tag = (built.save_dir / "latest").read_text().strip()
        theirs = base / "ds" / name / tag
        pairs.append((str(built.save_dir / tag), str(theirs)))
        ours = base / "zp" / name
        result = convert(built.save_dir, ours, UniversalOptions(progress=False))
        out[name] = (theirs, ours / result.tag, result)
    env = dict(os.environ, DS_ACCELERATOR="cpu", TORCH_EXTENSIONS_DIR=extensions_dir(base / "torch_extensions"))
    ran = run_group([sys.executable, "-c", _DS_CONVERT, json.dumps(pairs)], timeout=600, env=env)
    assert ran.returncode == 0, ran.stderr[-4000:]
    return out


def _same(a, b, path):
    if torch.is_tensor(a):
        assert torch.is_tensor(b) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), path
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (path, sorted(map(str, a)), sorted(map(str, b)))
        for k in a:
            _same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{path}[{i}]")
    elif hasattr(a, "__dict__") and not isinstance(a, type):
        assert type(a) is type(b), path
        _same(vars(a), vars(b), path)
    else:
        assert a == b, (path, a, b)


def _slim_zero3(state):
    """ZeRO-3's optimizer_state.pt as ours keeps it: DeepSpeed's also holds rank 0's partitions (never read)."""
    state = dict(state)
    state.pop("fp32_flat_groups", None)
    inner = state["optimizer_state_dict"]
    state["optimizer_state_dict"] = {"state": {g: {"step": e["step"]} for g, e in inner["state"].items()},
                                     "param_groups": inner["param_groups"]}
    return state


@pytest.mark.parametrize("name", AGAINST_DS)
def test_every_file_loads_to_what_ds_to_universal_writes(converted, name):
    theirs, ours, result = converted[name]
    files = sorted(p.relative_to(theirs) for p in (theirs / "zero").rglob("*.pt"))
    assert files == sorted(p.relative_to(ours) for p in (ours / "zero").rglob("*.pt"))
    for rel in files:
        a = torch.load(str(ours / rel), weights_only=False)
        b = torch.load(str(theirs / rel), weights_only=False)
        if rel.name == "optimizer_state.pt" and result.stage == 3:
            b = _slim_zero3(b)
        _same(a, b, str(rel))
    models = sorted(p.name for p in theirs.glob("*_model_states.pt"))
    assert models == sorted(p.name for p in ours.glob("*_model_states.pt")) == sorted(result.model_files)
    for m in models:
        assert (ours / m).read_bytes() == (theirs / m).read_bytes()
    assert (ours.parent / "latest_universal").read_text() == (theirs.parent / "latest_universal").read_text()
    trainable = {p.parent.name for p in (ours / "zero").rglob("exp_avg.pt")}
    assert len(trainable) == result.parameters and result.states[:3] == ["fp32", "exp_avg", "exp_avg_sq"]


def test_frozen_base_is_written_as_deepspeed_writes_it(converted):
    """ZeRO-2 keeps the frozen base in its module: fp32.pt only, the 16-bit weights widened; ZeRO-3 writes none."""
    _, ours2, z2 = converted["z2_w3_bf16_lora_frozen"]
    frozen = [n for n in z2.from_module if "lora_" not in n]
    assert frozen and all(sorted(p.name for p in (ours2 / "zero" / n).iterdir()) == ["fp32.pt"] for n in frozen)
    assert torch.load(str(ours2 / "zero" / frozen[0] / "fp32.pt"), weights_only=False)["param"].dtype == torch.float32
    _, ours3, z3 = converted["z3_w3_bf16_lora_frozen"]
    assert z3.from_module == [] and all("lora_" in p.name for p in (ours3 / "zero").iterdir() if p.is_dir())


def test_the_seed_layout_keeps_the_trainer_files_and_no_latest(checkpoints, tmp_path):
    built = checkpoints("trainer_z3_lora")
    result = convert(built.path, tmp_path / "out", UniversalOptions(progress=False))
    out = tmp_path / "out"
    assert {"trainer_state.json", "adapter_config.json", "latest_universal"} <= {p.name for p in out.iterdir()}
    assert sorted(result.copied) == sorted(p.name for p in out.iterdir() if p.is_file() and p.name != "latest_universal")
    assert any(n.startswith("rng_state_") for n in result.copied)
    assert not (out / "latest").exists()  # a plain load finds nothing instead of restarting the optimizer
    report = inspect_checkpoint(out)
    assert report.verdict == "ok" and report.layout.universal and report.universal_params == result.parameters
    assert report.resume_on.as_is == "any" and report.resume_on.same_global_batch == [1, 2]
    assert "on any number of data-parallel ranks" in report.resume
    with pytest.raises(InputError, match="already a universal checkpoint"):
        convert(out, tmp_path / "again", UniversalOptions(progress=False))


def test_inspect_names_the_world_sizes_before_conversion(checkpoints):
    report = inspect_checkpoint(checkpoints("z3_w3_bf16_lora_frozen").path)
    on = report.resume_on
    assert (on.as_is, on.after_universal) == ([3], "any")
    assert on.global_batch == 6 and on.micro_batch == 2 and on.same_global_batch == [1, 3]


# ---- the torch.save writer ---------------------------------------------------------------------------


def _span_tensor(path, shape, dtype="float32"):
    st = torchzip.load(path)["x"]
    return torchzip_writer.TensorOut(dtype, shape, lambda: iter([FileSpan(*st.span(), st.nbytes)]))


@pytest.mark.parametrize("zip64", [False, True])
def test_written_archives_load_as_torch_saved_ones(tmp_path, monkeypatch, zip64):
    if zip64:  # every size and offset through zip64 fields, as a record of 4 GiB or more gets them
        monkeypatch.setattr(torchzip_writer, "ZIP64_LIMIT", 1)
    source = torch.randn(12)
    torch.save({"x": source}, str(tmp_path / "src.pt"))
    scaler = LossScaler.__new__(LossScaler)
    scaler.__setstate__({"cur_scale": 1.0, "dynamic": False})
    obj = {"cat_dim": 0, "param": _span_tensor(tmp_path / "src.pt", (3, 4)),
           "step": torchzip_writer.TensorOut("float32", (), lambda: iter([struct.pack("<f", 7.0)])),
           "loss_scaler": scaler, "zero_stage": ZeroStageEnum(2),
           "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "foreach": None, "params": [0]}]}
    torchzip_writer.write(tmp_path / "fp32.pt", obj)
    got = torch.load(str(tmp_path / "fp32.pt"), weights_only=False)
    assert torch.equal(got["param"], source.view(3, 4)) and got["step"].item() == 7.0 and got["step"].dim() == 0
    assert got["cat_dim"] == 0 and got["param_groups"] == obj["param_groups"]
    from deepspeed.runtime.fp16.loss_scaler import LossScaler as RealScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum as RealStage

    assert type(got["loss_scaler"]) is RealScaler and got["loss_scaler"].cur_scale == 1.0
    assert got["zero_stage"] is RealStage.gradients
    assert torch.equal(torch.load(str(tmp_path / "fp32.pt"), weights_only=False, mmap=True)["param"], got["param"])
    with zipfile.ZipFile(tmp_path / "fp32.pt") as zf:
        assert zf.testzip() is None  # every CRC-32 holds
        assert {i.filename.split("/")[0] for i in zf.infolist()} == {"fp32"}  # torch names the folder after the file
    archive = torchzip.read_archive(tmp_path / "fp32.pt")
    assert all(r.offset % 64 == 0 for r in archive.records.values())  # storages aligned as torch aligns them
    back = torchzip.load(tmp_path / "fp32.pt")
    assert back["param"].shape == (3, 4) and back["zero_stage"].value == 2
    assert torch.equal(back["param"].to_torch(), source.view(3, 4))


def test_the_writer_refuses_what_deepspeed_never_saves(tmp_path):
    with pytest.raises(torchzip_writer.Unwritable):
        torchzip_writer.write(tmp_path / "x.pt", {"a": object()})
    assert not (tmp_path / "x.pt").exists()

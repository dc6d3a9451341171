"""The memory rules of `zeropilot check` on launch fixtures (MEM001-003).

The behaviour behind MEM001 (peaks that do and do not fit a card) was measured on an H200 under memory
caps (bench/plan/data); here the rules are run on launches whose plans do or do not fit.
"""

from pathlib import Path

import pytest

from tests.conftest import write_files
from zeropilot.check import check

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("ZEROPILOT_OFFLINE", "1")


def _findings(root, gpus):
    result, _ = check([root], gpus=gpus, select={"MEM001", "MEM002", "MEM003"}, use_installed=False)
    return result.findings


def _launch(tmp_path, model="Qwen/Qwen2-7B", stage=2, extra=""):
    return write_files(tmp_path, {
        "ds.json": {"zero_optimization": {"stage": stage}, "train_micro_batch_size_per_gpu": "auto"},
        "train.yaml": f"model_name_or_path: {model}\nfinetuning_type: lora\nlora_rank: 16\ndeepspeed: ds.json\n"
                      f"cutoff_len: 1024\nper_device_train_batch_size: 1\noutput_dir: out\n{extra}",
        "run.sh": "FORCE_TORCHRUN=1 NPROC_PER_NODE=4 llamafactory-cli train train.yaml\n"})


def test_mem001_fires_when_the_plan_does_not_fit(tmp_path):
    """Qwen2-7B LoRA at ZeRO-2 on 16 GiB cards: every GPU holds all 15 GB of 16-bit weights."""
    found = _findings(_launch(tmp_path), "4x16GiB")
    assert [(f.code, f.severity.value) for f in found] == [("MEM001", "error")]
    assert "does not fit" in found[0].message and found[0].key == "zero_optimization.stage"


def test_mem001_quiet_when_it_fits_or_without_gpus(tmp_path):
    root = _launch(tmp_path, stage=3)
    assert _findings(root, "4x16GiB") == []
    assert _findings(root, None) == []


def test_mem001_says_when_the_model_cannot_be_sized():
    found = _findings(EXAMPLES / "seed", "4x16GiB")
    assert [(f.code, f.severity.value) for f in found] == [("MEM001", "info")]
    assert "--model" in found[0].message


def test_mem002_fires_when_kept_checkpoints_outgrow_the_disk(tmp_path):
    (tmp_path / "out").mkdir()
    found = _findings(_launch(tmp_path, stage=3, extra="save_total_limit: 100000\n"), "4x80GiB")
    assert [f.code for f in found] == ["MEM002"]
    assert "save_total_limit" in found[0].message and found[0].key == "save_total_limit"


def test_mem003_fires_for_a_slow_save(tmp_path):
    """70B full fine-tuning writes ~1 TB per save: far past 10 minutes at 1 GB/s."""
    root = write_files(tmp_path, {
        "ds.json": {"zero_optimization": {"stage": 3}},
        "train.yaml": "model_name_or_path: meta-llama/Llama-3.1-70B\nfinetuning_type: full\ndeepspeed: ds.json\n"
                      "cutoff_len: 512\nsave_steps: 100\n",
        "run.sh": "FORCE_TORCHRUN=1 NNODES=4 NPROC_PER_NODE=8 llamafactory-cli train train.yaml\n"})
    found = [f for f in _findings(root, "8x141GiB") if f.code == "MEM003"]
    assert len(found) == 1 and "collective timeout" in found[0].message

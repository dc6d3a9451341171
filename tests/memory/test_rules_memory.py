"""The memory rules of `zeropilot check` on launch fixtures (MEM001-003).

The behaviour behind MEM001 (peaks that do and do not fit a card) was measured on an H200 under memory
caps (bench/plan/data/rows.jsonl); here the rules are run on launches whose plans do or do not fit.
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


RAW_SCRIPT = ("import deepspeed, torch\nfrom transformers import AutoModelForCausalLM\n"
              "model = AutoModelForCausalLM.from_pretrained('Qwen/Qwen2-7B', torch_dtype=torch.bfloat16)\n"
              "engine, *_ = deepspeed.initialize(model=model, config='ds.json')\n")


def _raw_launch(tmp_path, script=RAW_SCRIPT):
    return write_files(tmp_path, {
        "ds.json": {"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}},
        "train.py": script, "run.sh": "deepspeed --num_gpus 8 train.py\n"})


def test_mem004_fires_for_a_raw_zero3_script(tmp_path):
    """Qwen2-7B built whole (15.2 GB in bf16) on 8 x 16 GiB cards: initialize overflows before any step.

    Measured counterpart: bench/plan/data/rows.jsonl, source h200x2_call3: raw build on 16 GiB-capped H200s, OOM
    at init.
    """
    root = _raw_launch(tmp_path)
    result, _ = check([root], gpus="8x16GiB", select={"MEM004", "MEM001"}, use_installed=False)
    found = result.findings
    assert [f.code for f in found] == ["MEM004"]
    assert found[0].file.endswith("train.py") and found[0].line == 4 and "zero.Init" in found[0].message


def test_mem004_quiet_inside_zero_init_or_on_large_cards(tmp_path):
    wrapped = RAW_SCRIPT.replace("model = AutoModel", "with deepspeed.zero.Init(config_dict_or_path='ds.json'):\n"
                                                        "    model = AutoModel")
    result, _ = check([_raw_launch(tmp_path / "a", wrapped)], gpus="8x16GiB", select={"MEM004"}, use_installed=False)
    assert result.findings == []
    result, _ = check([_raw_launch(tmp_path / "b")], gpus="8x80GiB", select={"MEM004"}, use_installed=False)
    assert result.findings == []


def test_mem005_fires_when_offload_outgrows_the_host(tmp_path):
    """Qwen2-7B full fine-tuning with optimizer and parameter offload, 8 ranks on a 128 GiB host."""
    root = write_files(tmp_path, {
        "ds.json": {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                          "offload_param": {"device": "cpu"}}, "train_micro_batch_size_per_gpu": 1},
        "train.yaml": "model_name_or_path: Qwen/Qwen2-7B\nfinetuning_type: full\ndeepspeed: ds.json\n"
                      "cutoff_len: 1024\nper_device_train_batch_size: 1\noutput_dir: out\n",
        "run.sh": "FORCE_TORCHRUN=1 NPROC_PER_NODE=8 llamafactory-cli train train.yaml\n"})
    small, _ = check([root], gpus="8x80GiB", select={"MEM005"}, use_installed=False, host_mem=128)
    assert [f.code for f in small.findings] == ["MEM005"] and "OOM killer" in small.findings[0].message
    big, _ = check([root], gpus="8x80GiB", select={"MEM005"}, use_installed=False, host_mem=2048)
    assert big.findings == []
    unknown, _ = check([root], gpus="8x80GiB", select={"MEM005"}, use_installed=False)
    assert unknown.findings == []


def test_a_hardware_profile_changes_the_memory_rules(tmp_path):
    """A card whose stack holds 8 GiB outside PyTorch (a calibrate profile) tips a plan that fits on H200 figures."""
    import json

    root = _launch(tmp_path / "l", stage=3)
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({"schema": 1, "vendor": "rocm", "world_size": 4, "gpu_name": "DCU",
                                   "outside_torch_bytes": 8 * 2**30}))
    plain, _ = check([root], gpus="4x16GiB", select={"MEM001"}, use_installed=False)
    assert plain.findings == []
    tipped, _ = check([root], gpus="4x16GiB", select={"MEM001"}, use_installed=False, hardware=str(profile))
    assert [f.code for f in tipped.findings] == ["MEM001"]

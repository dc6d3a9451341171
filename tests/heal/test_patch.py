"""A fix made on copies of a launch's files: the command and the files that name a copy point at it, the user's
files are untouched, comments and layout kept (read by the same readers as ``check``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import write_files
from zeropilot.heal import patch

RAW = "import deepspeed\nengine, *_ = deepspeed.initialize(model=None)\n"
HF = "from transformers import Trainer\nTrainer().train()\n"
DS_JSON = """{
  // the raw loop's config
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 1,
  "zero_optimization": {
    "stage": 2
  }
}
"""


def _launch(root: Path, command):
    from zeropilot.runner import runinfo

    script = runinfo.write_launch_script(command, root / "launch.sh")
    _, launch, _ = runinfo.run_check(command, script)
    return launch


@pytest.fixture()
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_raw_deepspeed_batch_goes_to_a_copy_of_its_config_with_comments_kept(here):
    write_files(here, {"train.py": RAW, "ds.json": DS_JSON})
    cmd = ["deepspeed", "--num_gpus", "2", "train.py", "--deepspeed_config", "ds.json"]
    p = patch.apply({"micro_batch": 2, "grad_accum": 2}, cmd, {}, _launch(here, cmd), here / "attempt-2" / "launch")
    assert isinstance(p, patch.Patch), p
    copy = here / "attempt-2" / "launch" / "ds.json"
    assert p.command == cmd[:-1] + [str(copy)] and p.files == [{"original": str(here / "ds.json"), "copy": str(copy)}]
    assert p.settings == ["train_micro_batch_size_per_gpu: 4 -> 2 (ds.json)",
                          "gradient_accumulation_steps: 1 -> 2 (ds.json)"]
    assert not copy.exists()  # planned only: the loop writes the copies when it uses the fix
    p.write()
    assert (here / "ds.json").read_text() == DS_JSON
    text = copy.read_text()
    assert "// the raw loop's config" in text and '"train_micro_batch_size_per_gpu": 2' in text
    assert "-  \"gradient_accumulation_steps\": 1," in p.diff and "+  \"gradient_accumulation_steps\": 2," in p.diff


def test_hf_flags_are_rewritten_in_the_command_and_an_added_section_lands_in_the_copied_config(here):
    write_files(here, {"train.py": HF, "ds.json": {"train_micro_batch_size_per_gpu": "auto",
                                                    "zero_optimization": {"stage": 2}}})
    cmd = ["torchrun", "--nproc_per_node", "2", "train.py", "--deepspeed", "ds.json",
           "--per_device_train_batch_size=4", "--gradient_accumulation_steps", "1"]
    launch = _launch(here, cmd)
    p = patch.apply({"micro_batch": 2, "grad_accum": 2}, cmd, {}, launch, here / "c")
    assert p.command[-3:] == ["--per_device_train_batch_size=2", "--gradient_accumulation_steps", "2"]
    assert patch.apply({"seq_len": 128}, cmd, {}, launch, here / "c") == (
        "max_length, max_seq_length: not in a file or flag of the launch (set in the script's code?)")
    assert p.files == []  # "auto" in the DeepSpeed config follows the Trainer's arguments: not touched
    p = patch.apply({"offload_optimizer": "cpu"}, cmd, {}, launch, here / "c")
    p.write()
    assert json.loads((here / "c" / "ds.json").read_text())["zero_optimization"] == {
        "stage": 2, "offload_optimizer": {"device": "cpu"}}
    assert p.command[5] == str(here / "c" / "ds.json")


def test_llamafactory_yaml_copied_and_pointed_at_the_copied_deepspeed_config(here):
    write_files(here, {"ds.json": {"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 2}},
                       "sft.yaml": "model_name_or_path: Qwen/Qwen2.5-0.5B\nstage: sft\nfinetuning_type: lora\n"
                                   "deepspeed: ds.json  # ZeRO-2\ncutoff_len: 4096\n"
                                   "per_device_train_batch_size: 4\ngradient_accumulation_steps: 2\n"})
    cmd = ["llamafactory-cli", "train", "sft.yaml"]
    launch = _launch(here, cmd)
    p = patch.apply({"stage": 3}, cmd, {}, launch, here / "c")
    p.write()
    yaml_copy, ds_copy = here / "c" / "sft.yaml", here / "c" / "ds.json"
    assert p.command == ["llamafactory-cli", "train", str(yaml_copy)]
    assert f"deepspeed: {ds_copy}  # ZeRO-2" in yaml_copy.read_text()
    assert json.loads(ds_copy.read_text())["zero_optimization"]["stage"] == 3
    assert "deepspeed: ds.json" in (here / "sft.yaml").read_text()
    cut = patch.apply({"seq_len": 2048}, cmd, {}, launch, here / "d")
    assert cut.settings == ["cutoff_len: 4096 -> 2048 (sft.yaml)"]
    gc = patch.apply({"gradient_checkpointing": True}, cmd, {}, launch, here / "e")
    assert gc.settings == ["disable_gradient_checkpointing: (unset) -> false (sft.yaml)"]


def test_what_lives_in_the_script_cannot_be_changed_and_the_environment_can(here, monkeypatch):
    write_files(here, {"train.py": RAW, "ds.json": {"train_batch_size": 16, "zero_optimization": {"stage": 3}}})
    cmd = ["deepspeed", "train.py", "--deepspeed_config", "ds.json"]
    launch = _launch(here, cmd)
    assert "own code" in patch.apply({"gradient_checkpointing": True}, cmd, {}, launch, here / "c")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")
    p = patch.apply({"expandable_segments": True}, cmd, {}, launch, here / "c")
    assert p.env == {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,expandable_segments:True"}
    assert p.command == cmd and p.files == []
    assert "already" in patch.apply({"stage": 3}, cmd, {}, launch, here / "c")
    assert "does not make the change" in patch.apply({"world_size": 4}, cmd, {}, launch, here / "c")
    assert not (here / "c").exists()

import os
from pathlib import Path

import pytest

from tests.conftest import write_files
from zeropilot.errors import InputError
from zeropilot.launch import load_launch

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_seed_example_is_read_and_linked():
    launch = load_launch([EXAMPLES / "seed"], use_installed=False)
    assert [d.kind for d in sorted(launch.documents, key=lambda d: d.path.name)] == ["train_args", "ds_config"]
    (train, ds), = launch.training_pairs()
    assert train.flavour == "llamafactory" and ds.path.name == "deepspeed_z3_offload_4x16g.json"
    assert launch.world_size.value == 4 and "ROCR_VISIBLE_DEVICES" in launch.world_size.reason
    assert launch.versions.raw("deepspeed") == "0.14.2+das.opt1.dtk25041"  # from pip-freeze.txt
    assert launch.env()["NCCL_TIMEOUT"].line == 14


def test_flags_on_a_deepspeed_command(tmp_path):
    root = write_files(tmp_path, {
        "ds.json": {"zero_optimization": {"stage": 2}},
        "train.sh": "deepspeed --num_gpus 2 train.py \\\n  --deepspeed ds.json \\\n"
                    "  --gradient_accumulation_steps 16\n",
    })
    launch = load_launch([root], use_installed=False)
    (flags, ds), = launch.training_pairs()
    assert flags.fmt == "flags" and flags.value("gradient_accumulation_steps") == 16
    assert flags.get("gradient_accumulation_steps").line == 3
    assert launch.world_size.value == 2


def test_world_size_override_and_nodes(tmp_path):
    root = write_files(tmp_path, {"run.sh": "torchrun --nnodes 2 --nproc_per_node 8 train.py\n"})
    assert load_launch([root], use_installed=False).world_size.value == 16
    assert load_launch([root], world_size=3, use_installed=False).world_size.value == 3


def test_missing_path_is_input_error(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        load_launch([tmp_path / "nope.json"], use_installed=False)


def test_bad_files_are_collected_not_raised(tmp_path):
    root = write_files(tmp_path, {"ok.json": {"zero_optimization": {"stage": 1}}, "bad.json": "{,}"})
    (root / "bin.json").write_bytes(b"\x00\x01\x02")
    (root / "latin.yaml").write_bytes("a: caf\xe9\n".encode("latin-1"))
    launch = load_launch([root], use_installed=False)
    messages = sorted(e.render() for e in launch.read_errors)
    assert len(messages) == 3 and len(launch.ds_configs) == 1
    assert any("binary" in m for m in messages) and any("not UTF-8" in m and ":1:7" in m for m in messages)


def test_symlink_loop(tmp_path):
    os.symlink(tmp_path / "b", tmp_path / "a")
    os.symlink(tmp_path / "a", tmp_path / "b")
    with pytest.raises(InputError, match="loop"):
        load_launch([tmp_path / "a"], use_installed=False)
    assert load_launch([tmp_path], use_installed=False).documents == []


def test_fp16_flag_is_a_training_argument_and_fp16_section_a_deepspeed_key(tmp_path):
    root = write_files(tmp_path, {"args.yaml": "output_dir: out\nlearning_rate: 1.0e-4\nfp16: true\nbf16: false\n",
                                  "ds.json": {"fp16": {"enabled": True}, "bf16": {"enabled": False}}})
    kinds = {d.path.name: d.kind for d in load_launch([root], use_installed=False).documents}
    assert kinds == {"args.yaml": "train_args", "ds.json": "ds_config"}

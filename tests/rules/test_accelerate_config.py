"""AC rules: fixture tests and witnesses on the installed accelerate."""

import os

import pytest

from tests.conftest import codes, run_check

V = "accelerate=1.15.0,deepspeed=0.19.8,transformers=5.24.0"
DS = {"train_micro_batch_size_per_gpu": "auto", "gradient_clipping": "auto", "zero_optimization": {"stage": 3}}
BAD_YAML = """\
compute_environment: LOCAL_MACHINE
distributed_type: DEEPSPEED
mixed_precision: bf16
num_processes: 2
deepspeed_config:
  deepspeed_config_file: ds.json
  zero_stage: 3
  zero3_init_flag: true
"""
GOOD_YAML = """\
compute_environment: LOCAL_MACHINE
distributed_type: DEEPSPEED
num_processes: 2
deepspeed_config:
  deepspeed_config_file: ds.json
  zero3_init_flag: true
"""


def test_ac001_fires_on_duplicated_settings(launch_dir):
    root = launch_dir({"ds.json": DS, "acc.yaml": BAD_YAML})
    findings = run_check(root, versions=V, select={"AC001"})
    assert sorted(f.key for f in findings) == ["deepspeed_config.zero_stage", "mixed_precision"]


def test_ac001_quiet_on_config_file_alone_and_cli_precision(launch_dir):
    root = launch_dir({"ds.json": DS, "acc.yaml": GOOD_YAML})
    assert run_check(root, versions=V, select={"AC001"}) == []
    root = launch_dir({"ds.json": DS, "acc.yaml": BAD_YAML.replace("  zero_stage: 3\n", ""),
                       "run.sh": "accelerate launch --config_file acc.yaml --mixed_precision bf16 train.py\n"})
    assert run_check(root, versions=V, select={"AC001"}) == []


def _accelerate_start(tmp_path, yaml_text):
    """What `accelerate launch --config_file` hands the processes, then the plugin every process builds."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import DeepSpeedPlugin

    (tmp_path / "acc.yaml").write_text(yaml_text)
    (tmp_path / "ds.json").write_text(__import__("json").dumps(DS))
    args = launch_command_parser().parse_args(["--config_file", str(tmp_path / "acc.yaml"), "train.py"])
    args, defaults, mp_from_config = _validate_launch_command(args)
    # accelerate/commands/launch.py launch_command -> utils/launch.py prepare_deepspeed_cmd_env
    fields = list(defaults.deepspeed_config.keys()) + (["mixed_precision"] if mp_from_config else [])
    old = os.environ.get("ACCELERATE_CONFIG_DS_FIELDS")
    os.environ["ACCELERATE_CONFIG_DS_FIELDS"] = ",".join(fields).lower()
    try:
        return DeepSpeedPlugin(hf_ds_config=str(tmp_path / "ds.json"))
    finally:
        if old is None:
            os.environ.pop("ACCELERATE_CONFIG_DS_FIELDS", None)
        else:
            os.environ["ACCELERATE_CONFIG_DS_FIELDS"] = old


@pytest.mark.witness
def test_ac001_witness(tmp_path):
    """accelerate's own launch parsing + DeepSpeedPlugin refuse the duplicated settings, accept the file alone."""
    with pytest.raises(ValueError, match="When using `deepspeed_config_file`, the following accelerate config"):
        _accelerate_start(tmp_path, BAD_YAML)
    with pytest.raises(ValueError, match="When using `deepspeed_config_file`"):
        _accelerate_start(tmp_path, BAD_YAML.replace("  zero_stage: 3\n", ""))  # mixed_precision alone
    plugin = _accelerate_start(tmp_path, GOOD_YAML)
    assert plugin.zero_stage == 3


def test_ac002_fires_on_linked_config_without_zero(launch_dir):
    root = launch_dir({"ds.json": {"train_micro_batch_size_per_gpu": "auto", "bf16": {"enabled": "auto"}},
                       "train.yaml": "output_dir: o\ndeepspeed: ds.json\nlearning_rate: 1.0e-4\n"})
    assert codes(run_check(root, versions=V, select={"AC002"})) == ["AC002"]


def test_ac002_quiet_with_zero_or_unlinked(launch_dir):
    root = launch_dir({"ds.json": DS, "train.yaml": "output_dir: o\ndeepspeed: ds.json\nlearning_rate: 1.0e-4\n"})
    assert run_check(root, versions=V, select={"AC002"}) == []
    alone = launch_dir({"other.json": {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}}})
    assert run_check(alone, versions=V, select={"AC002"}) == []


@pytest.mark.witness
def test_ac002_witness():
    from accelerate.utils import DeepSpeedPlugin

    with pytest.raises(ValueError, match="Please specify the ZeRO optimization config"):
        DeepSpeedPlugin(hf_ds_config={"train_micro_batch_size_per_gpu": "auto", "bf16": {"enabled": "auto"}})
    assert DeepSpeedPlugin(hf_ds_config=dict(DS, zero_optimization={"stage": 0})).zero_stage == 0

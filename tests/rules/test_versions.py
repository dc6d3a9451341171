"""VR rules: version gates on fixtures (citing the upstream fixes) and witnesses on the installed DeepSpeed."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import codes, run_check

ROOT = Path(__file__).resolve().parents[2]
Z2 = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
      "zero_optimization": {"stage": 2}}
LF_YAML = """\
model_name_or_path: Qwen/Qwen2-7B
stage: sft
finetuning_type: lora
template: qwen
deepspeed: ds.json
output_dir: out
per_device_train_batch_size: 1
gradient_accumulation_steps: 16
"""


# ---- VR001 no_sync ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("versions,fires", [
    ("deepspeed=0.16.0,transformers=4.46.1", True),             # DeepSpeed PR #6675 x transformers 4.46.x
    ("deepspeed=0.16.2+das.opt1.dtk25041,transformers=4.47.0", True),  # vendor build, last broken transformers
    ("deepspeed=0.16.0,transformers=4.47.1", False),            # transformers PR #35157
    ("deepspeed=0.15.4,transformers=4.46.1", False),            # no engine.no_sync before 0.16.0
    ("deepspeed=0.14.2+das.opt1.dtk25041,transformers=4.46.1", False),  # the seed's DCU build
    ("transformers=4.46.1", False),                             # DeepSpeed version unknown: no verdict
])
def test_vr001_trainer_version_gates(launch_dir, versions, fires):
    root = launch_dir({"ds.json": Z2, "train.yaml": LF_YAML})
    assert codes(run_check(root, versions=versions, select={"VR001"})) == (["VR001"] if fires else [])


def test_vr001_quiet_without_accumulation_or_below_stage_2(launch_dir):
    v = "deepspeed=0.16.0,transformers=4.46.1"
    root = launch_dir({"ds.json": Z2, "train.yaml": LF_YAML.replace("accumulation_steps: 16", "accumulation_steps: 1")})
    assert run_check(root, versions=v, select={"VR001"}) == []
    root = launch_dir({"ds.json": dict(Z2, zero_optimization={"stage": 1}), "train.yaml": LF_YAML})
    assert run_check(root, versions=v, select={"VR001"}) == []


def test_vr001_accelerate_accumulate(launch_dir):
    files = {"ds.json": dict(Z2, gradient_accumulation_steps=4),
             "acc.yaml": "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\nnum_processes: 2\n"
                         "deepspeed_config:\n  deepspeed_config_file: ds.json\n",
             "train.py": "from accelerate import Accelerator\nacc = Accelerator()\n"
                         "with acc.accumulate(model):\n    pass\n"}
    root = launch_dir(files)
    assert codes(run_check(root, versions="deepspeed=0.16.0,accelerate=1.8.1", select={"VR001"})) == ["VR001"]
    assert run_check(root, versions="deepspeed=0.16.0,accelerate=1.9.0", select={"VR001"}) == []  # PR #3656


@pytest.mark.witness
@pytest.mark.slow
def test_vr001_witness(engine_probe):
    """A real ZeRO-2 engine (DeepSpeed 0.19.8, gloo, one process) asserts in no_sync(), as VR001 says."""
    assert engine_probe["stage"] == 2
    assert engine_probe["no_sync"] == ("no_sync context manager is incompatible with gradient partitioning "
                                       "logic of ZeRO stage 2")


# ---- VR002 float auto fill --------------------------------------------------------------------------------

Z3_AUTO = {"train_micro_batch_size_per_gpu": "auto",
           "zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": "auto"}}


@pytest.mark.parametrize("versions,fires", [
    ("deepspeed=0.15.1,transformers=4.44.2", True),   # DeepSpeed #6525
    ("deepspeed=0.15.1,transformers=4.45.0", False),  # transformers PR #33402
    ("deepspeed=0.14.2+das.opt1.dtk25041,transformers=4.44.2", False),  # truncated silently before 0.15
    ("deepspeed=0.15.1", False),                       # transformers unknown: no verdict
])
def test_vr002_version_gates(launch_dir, versions, fires):
    root = launch_dir({"ds.json": Z3_AUTO, "train.yaml": LF_YAML})
    assert codes(run_check(root, versions=versions, select={"VR002"})) == (["VR002"] if fires else [])


def test_vr002_accelerate_only_and_stage_2(launch_dir):
    acc = ("compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\nnum_processes: 2\n"
           "deepspeed_config:\n  deepspeed_config_file: ds.json\n")
    root = launch_dir({"ds.json": Z3_AUTO, "acc.yaml": acc})
    assert codes(run_check(root, versions="deepspeed=0.15.1,accelerate=0.30.1", select={"VR002"})) == ["VR002"]
    assert run_check(root, versions="deepspeed=0.15.1,accelerate=0.31.0", select={"VR002"}) == []  # PR #2814
    root = launch_dir({"ds.json": dict(Z3_AUTO, zero_optimization={"stage": 2, "stage3_prefetch_bucket_size":
                                                                   "auto"}), "train.yaml": LF_YAML})
    assert run_check(root, versions="deepspeed=0.15.1,transformers=4.44.2", select={"VR002"}) == []


@pytest.mark.witness
def test_vr002_witness():
    """The old fill (0.9*h*h) is refused by DeepSpeed 0.19.8; today's transformers fills an int that passes."""
    from deepspeed.runtime.config import DeepSpeedConfig
    from pydantic import ValidationError
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig, unset_hf_deepspeed_config

    old_fill = 0.9 * 4096 * 4096
    with pytest.raises(ValidationError, match="int_from_float|fractional"):
        DeepSpeedConfig({"train_micro_batch_size_per_gpu": 1,
                         "zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": old_fill}})
    hf = HfTrainerDeepSpeedConfig(json.loads(json.dumps(Z3_AUTO)))
    args = SimpleNamespace(get_warmup_steps=lambda n: 0)
    try:
        hf.trainer_config_finalize(args, SimpleNamespace(config=SimpleNamespace(hidden_size=4096)), 10)
    finally:
        unset_hf_deepspeed_config()
    filled = hf.config["zero_optimization"]["stage3_prefetch_bucket_size"]
    assert filled == int(old_fill) and isinstance(filled, int)
    DeepSpeedConfig(dict(hf.config, train_micro_batch_size_per_gpu=1))

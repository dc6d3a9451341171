"""HF rules: fixture tests and witnesses on the installed transformers."""

import re
from types import SimpleNamespace

import pytest
import yaml

from tests.conftest import codes, run_check
from zeropilot.fix.edits import apply_to_text

V = "deepspeed=0.19.8,transformers=5.24.0"

# The seed guide's "fix": DeepSpeed GA 1 while the Trainer accumulates 16; plus concrete values that disagree.
SEED_DS = {
    "train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
    "gradient_clipping": 0.5,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_max_lr": 2e-4, "total_num_steps": 100,
                                                       "warmup_num_steps": 10}},
    "fp16": {"enabled": True}, "bf16": {"enabled": False},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": 1e8},
}
SEED_YAML = """\
model_name_or_path: Qwen/Qwen2-7B
stage: sft
finetuning_type: lora
template: qwen
deepspeed: ds.json
output_dir: out
per_device_train_batch_size: 2
gradient_accumulation_steps: 16
learning_rate: 1.0e-4
weight_decay: 0.1
max_steps: 200
warmup_steps: 10
bf16: true
"""
EXPECTED = {"gradient_accumulation_steps", "train_batch_size", "gradient_clipping", "optimizer.params.betas",
            "scheduler.params.warmup_max_lr", "scheduler.params.total_num_steps", "fp16.enabled", "bf16.enabled"}


def test_hf001_fires_on_each_mismatch(launch_dir):
    root = launch_dir({"ds.json": SEED_DS, "train.yaml": SEED_YAML})
    findings = run_check(root, versions=V, world_size=1, select={"HF001"})
    assert {f.key for f in findings} == EXPECTED
    ga = next(f for f in findings if f.key == "gradient_accumulation_steps")
    assert "ds gradient_accumulation_steps=1 vs hf gradient_accumulation_steps=16" in ga.message
    assert all(f.fix is not None and f.fix.applicability.value == "safe" for f in findings)


def test_hf001_fix_sets_auto_and_then_quiet(launch_dir):
    root = launch_dir({"ds.json": SEED_DS, "train.yaml": SEED_YAML})
    findings = run_check(root, versions=V, world_size=1, select={"HF001"})
    path = root / "ds.json"
    new, applied = apply_to_text(path.read_text(), [e for f in findings for e in f.fix.edits])
    assert applied == len(EXPECTED)
    path.write_text(new)
    assert run_check(root, versions=V, world_size=1, select={"HF001"}) == []


def test_hf001_quiet_on_auto_and_defaults(launch_dir):
    ds = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
          "gradient_clipping": 1.0, "fp16": {"enabled": False}, "bf16": {"enabled": "auto"},
          "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": [0.9, 0.999], "eps": 1e-8}},
          "zero_optimization": {"stage": 2}}
    root = launch_dir({"ds.json": ds, "train.yaml": "output_dir: o\ndeepspeed: ds.json\nbf16: true\n"})
    assert run_check(root, versions=V, world_size=4, select={"HF001"}) == []


def test_hf001_reads_flags_on_a_deepspeed_command(launch_dir):
    root = launch_dir({"ds.json": {"gradient_accumulation_steps": 4, "train_micro_batch_size_per_gpu": "auto"},
                       "run.sh": "deepspeed --num_gpus 2 train.py --deepspeed ds.json --output_dir o "
                                 "--gradient_accumulation_steps 8\n"})
    findings = run_check(root, versions=V, select={"HF001"})
    assert [f.key for f in findings] == ["gradient_accumulation_steps"]


def _witness_error(ds_config, train_args, world_size=1):
    """Run the real HF integration on the fixture's values; return the mismatch lines it raises."""
    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig, unset_hf_deepspeed_config

    args = TrainingArguments(use_cpu=True, report_to=[], **train_args)
    assert args.world_size == world_size
    hf = HfTrainerDeepSpeedConfig(ds_config)
    hf.trainer_config_process(args)
    model = SimpleNamespace(config=SimpleNamespace(hidden_size=64))
    try:
        hf.trainer_config_finalize(args, model, num_training_steps=args.max_steps)
    except ValueError as exc:
        return re.findall(r"^- (ds .*)$", str(exc), re.M)
    finally:
        unset_hf_deepspeed_config()  # the integration keeps a global reference; leave none behind
    return []


@pytest.mark.witness
def test_hf001_witness(launch_dir, tmp_path):
    """transformers' own fill_match raises exactly the mismatches HF001 predicts, and none after its fix."""
    import copy

    root = launch_dir({"ds.json": SEED_DS, "train.yaml": SEED_YAML})
    findings = run_check(root, versions=V, world_size=1, select={"HF001"})
    predicted = sorted(re.search(r"^(ds .*?)(?: \(world size.*?\))?:", f.message).group(1) for f in findings)
    hf_keys = {"output_dir", "per_device_train_batch_size", "gradient_accumulation_steps", "learning_rate",
               "weight_decay", "max_steps", "warmup_steps", "bf16"}
    args = {k: v for k, v in yaml.safe_load(SEED_YAML).items() if k in hf_keys}
    args["output_dir"] = str(tmp_path / "out")
    raised = _witness_error(copy.deepcopy(SEED_DS), args)
    assert sorted(raised) == predicted and len(raised) == len(EXPECTED)
    fixed = copy.deepcopy(SEED_DS)
    for f in findings:
        *parents, last = f.key.split(".")
        target = fixed
        for part in parents:
            target = target[part]
        target[last] = "auto"
    assert _witness_error(fixed, args) == []


# ---- HF002 ----------------------------------------------------------------------------------------------

def test_hf002_fires_on_both(launch_dir):
    root = launch_dir({"train.yaml": "output_dir: o\nlearning_rate: 1.0e-4\nnum_train_epochs: 1\nfp16: true\nbf16: true\n"})
    assert codes(run_check(root, versions=V, select={"HF002"})) == ["HF002"]


def test_hf002_quiet_on_one(launch_dir):
    root = launch_dir({"train.yaml": "output_dir: o\nlearning_rate: 1.0e-4\nnum_train_epochs: 1\nfp16: false\nbf16: true\n"})
    assert run_check(root, versions=V, select={"HF002"}) == []


@pytest.mark.witness
def test_hf002_witness(tmp_path):
    from transformers import TrainingArguments

    with pytest.raises(ValueError, match="At most one of fp16 and bf16"):
        TrainingArguments(output_dir=str(tmp_path), use_cpu=True, fp16=True, bf16=True)


# ---- HF003 ----------------------------------------------------------------------------------------------

def test_hf003_fires_by_version(launch_dir):
    root = launch_dir({"train.yaml": "output_dir: o\nlearning_rate: 1.0e-4\nsharded_ddp: zero3\nno_cuda: false\n"
                                     "warmup_ratio: 0.1\n"})
    assert {f.key for f in run_check(root, versions=V, select={"HF003"})} == {"sharded_ddp", "no_cuda",
                                                                               "warmup_ratio"}
    assert {f.key for f in run_check(root, versions="transformers=4.57.6", select={"HF003"})} == {"sharded_ddp"}
    assert run_check(root, versions="transformers=4.33.3", select={"HF003"}) == []


def test_hf003_quiet_on_llamafactory_own_key(launch_dir):
    root = launch_dir({"train.yaml": "model_name_or_path: m\nstage: sft\nfinetuning_type: lora\ntemplate: qwen\n"
                                     "output_dir: o\noverwrite_output_dir: true\nlearning_rate: 1.0e-4\n"})
    assert run_check(root, versions=V, select={"HF003"}) == []


@pytest.mark.witness
@pytest.mark.parametrize("key", sorted(__import__("zeropilot.rules.hf_integration", fromlist=["x"]).REMOVED_ARGS))
def test_hf003_witness(key, tmp_path):
    """Each argument HF003 calls removed is refused by the installed transformers' HfArgumentParser."""
    import transformers
    from packaging.version import Version
    from transformers import HfArgumentParser, TrainingArguments

    from zeropilot.rules.hf_integration import REMOVED_ARGS

    assert Version(transformers.__version__) >= Version(REMOVED_ARGS[key].since)
    with pytest.raises(ValueError, match="not used by the HfArgumentParser"):
        HfArgumentParser(TrainingArguments).parse_dict({"output_dir": str(tmp_path), "use_cpu": True, key: 1})


def test_hf001_apex_amp_before_transformers_5(launch_dir):
    """transformers 4.x also compares Apex amp (integrations/deepspeed.py of the 4.57.6 wheel)."""
    ds = {"amp": {"enabled": True, "opt_level": "O2"}, "fp16": {"enabled": "auto"}, "zero_optimization": {"stage": 0}}
    yaml_text = "output_dir: o\ndeepspeed: ds.json\nlearning_rate: 1.0e-4\nfp16: true\n"
    root = launch_dir({"ds.json": ds, "train.yaml": yaml_text})
    old = run_check(root, versions="transformers=4.46.1", select={"HF001"})
    assert {f.key for f in old} == {"amp.enabled", "amp.opt_level"}
    assert run_check(root, versions="transformers=5.24.0", select={"HF001"}) == []
    apex = launch_dir({"ds.json": ds, "train.yaml": yaml_text + "fp16_backend: apex\nfp16_opt_level: O2\n"})
    assert run_check(apex, versions="transformers=4.46.1", select={"HF001"}) == []


def test_hf003_unknown_version_is_a_warning(launch_dir):
    root = launch_dir({"train.yaml": "output_dir: o\nlearning_rate: 1.0e-4\nsharded_ddp: zero3\n"})
    findings = run_check(root, select={"HF003"})
    assert [(f.key, f.severity.value) for f in findings] == [("sharded_ddp", "warning")]

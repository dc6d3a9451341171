"""DS020 (batch values DeepSpeed cannot complete): fixtures, and the witness on the installed DeepSpeed."""

import pytest

from tests.conftest import run_check
from tests.rules.init_probe import BATCH_CASES
from zeropilot.rules.batch import derive

DS_NEW = "deepspeed=0.19.8"
RAW = "import deepspeed\nengine, *_ = deepspeed.initialize(model=m, config='ds.json')\n"


def _ds020(launch_dir, values, world, raw=True):
    files = {"ds.json": dict(values, steps_per_print=100)}  # one DeepSpeed-only key, so the file reads as one
    if raw:
        files["train.py"] = RAW
    return run_check(launch_dir(files), versions=DS_NEW, world_size=world, select={"DS020"})


@pytest.mark.parametrize("name", sorted(BATCH_CASES))
def test_ds020_cases(launch_dir, name):
    """The rule fires on the probe cases DeepSpeed refuses (the witness checks the refusals)."""
    values, world = BATCH_CASES[name]
    expected = derive(values.get("train_batch_size"), values.get("train_micro_batch_size_per_gpu"),
                      values.get("gradient_accumulation_steps"), world).error is not None
    assert bool(_ds020(launch_dir, values, world)) is expected


@pytest.mark.witness
@pytest.mark.slow
def test_ds020_witness(init_probe):
    """DeepSpeedConfig (gloo up, world size from the mpu) refuses exactly the cases derive() refuses."""
    for name, (values, world) in BATCH_CASES.items():
        mine = derive(values.get("train_batch_size"), values.get("train_micro_batch_size_per_gpu"),
                      values.get("gradient_accumulation_steps"), world).error
        theirs = init_probe[f"batch:{name}"]
        assert (mine is None) is (theirs == "ok"), (name, mine, theirs)
    assert "needs to be provided" in init_probe["batch:g4_w1"]


def test_ds020_no_world_size_satisfies(launch_dir):
    """Without a known world size: 30 is not a multiple of micro 4, whatever the world size."""
    [f] = _ds020(launch_dir, {"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4}, None)
    assert f.key == "train_batch_size" and "no world size" in f.message
    assert _ds020(launch_dir, {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4}, None) == []


def test_ds020_ga_only_outside_hf(launch_dir):
    assert len(_ds020(launch_dir, {"gradient_accumulation_steps": 4}, None)) == 1
    files = {"ds.json": {"gradient_accumulation_steps": 4, "zero_optimization": {"stage": 2}},
             "train.yaml": "output_dir: o\ndeepspeed: ds.json\n"}
    assert run_check(launch_dir(files), versions=DS_NEW, select={"DS020"}) == []


def test_ds020_world_from_launch(launch_dir):
    """The world size comes from the launch command (deepspeed --num_gpus 4)."""
    files = {"ds.json": {"train_batch_size": 30}, "run.sh": "deepspeed --num_gpus 4 train.py --deepspeed ds.json\n"}
    [f] = run_check(launch_dir(files), versions=DS_NEW, select={"DS020"})
    assert "world size 4" in f.message


def test_raw_deepspeed_flags_are_not_training_arguments(launch_dir):
    """`deepspeed train.py --deepspeed --deepspeed_config ds.json` running a raw deepspeed.initialize script: the
    flags are DeepSpeed's own (deepspeed.add_config_arguments), no HF rule applies, DS020 sees a raw launch."""
    files = {"ds.json": {"gradient_accumulation_steps": 2, "steps_per_print": 10},
             "train.py": "import deepspeed\nengine, *_ = deepspeed.initialize(model=m, config=args.deepspeed_config)\n",
             "run.sh": "deepspeed --num_gpus 2 train.py --deepspeed --deepspeed_config ds.json\n"}
    findings = run_check(launch_dir(files), versions=DS_NEW)
    errors = sorted(f.code for f in findings if f.severity.value == "error")
    assert errors == ["DS020"], errors


# ---- DS021: the HF Trainer fills "auto" keys only ---------------------------------------------------------------

HF_CASES = [  # (config batch keys, training arguments, DS021 severity or None)
    ({"train_micro_batch_size_per_gpu": "auto"}, {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 4},
     "warning"),
    ({}, {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 4}, "error"),
    ({"train_batch_size": "auto"}, {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 4}, "warning"),
    ({"gradient_accumulation_steps": "auto"}, {"per_device_train_batch_size": 2}, "error"),
    ({"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"},
     {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 4}, None),
    ({"train_micro_batch_size_per_gpu": "auto"}, {"per_device_train_batch_size": 2}, None),
]


@pytest.mark.parametrize("keys,args,severity", HF_CASES)
def test_ds021_fixtures(launch_dir, keys, args, severity):
    yaml = "output_dir: o\n" + "".join(f"{k}: {v}\n" for k, v in args.items()) + "deepspeed: ds.json\n"
    files = {"ds.json": dict(keys, zero_optimization={"stage": 2}), "train.yaml": yaml}
    found = [f.severity.value for f in run_check(launch_dir(files), versions=DS_NEW, select={"DS021"})]
    assert found == ([severity] if severity else [])


@pytest.mark.witness
def test_ds021_witness(tmp_path):
    """transformers' own TrainingArguments(deepspeed=...) + trainer_config_finalize, then DeepSpeedConfig: refused
    without both batch keys; built with GA 1 (or micro 8) when a key is missing, against the arguments."""
    from types import SimpleNamespace

    from deepspeed.runtime.config import DeepSpeedConfig
    from transformers import TrainingArguments

    def build(keys, args):
        a = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none",
                              deepspeed=dict(keys, zero_optimization={"stage": 2}), **args)
        a.hf_deepspeed_config.trainer_config_finalize(a, SimpleNamespace(config=SimpleNamespace(hidden_size=64)), 10)
        try:
            c = DeepSpeedConfig(a.hf_deepspeed_config.config)
        except AssertionError as exc:
            return str(exc)
        return (c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps)

    results = [build(keys, args) for keys, args, _ in HF_CASES]
    assert results[0] == (2, 1)  # the arguments say 4 accumulation steps
    assert "needs to be provided" in results[1] and "needs to be provided" in results[3]
    assert results[2] == (8, 1)  # the arguments say micro batch 2
    assert results[4] == (2, 4) and results[5] == (2, 1)

"""The oracle: the installed DeepSpeed / transformers / accelerate judge configs in one subprocess per launch.

One launch folder holds a raw DeepSpeed config, an HF Trainer pair, an accelerate pair and a healthy config, so the
whole module costs one worker run (the libraries are imported once).
"""

import pytest

from tests.conftest import write_files
from zeropilot.check import check
from zeropilot.launch import load_launch
from zeropilot.oracle import ask, cases

FILES = {
    "raw/ds.json": {"train_micro_batch_size_per_gpu": 1, "gradient_allreduce_op": "sum",
                    "zero_optimization": {"stage": 3}},
    "hf/ds.json": {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": "auto",
                   "zero_optimization": {"stage": 2}},
    "hf/train.yaml": "output_dir: out\nper_device_train_batch_size: 2\ndeepspeed: ds.json\n",
    "acc/ds.json": {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}},
    "acc/accelerate.yaml": "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\n"
                           "deepspeed_config:\n  deepspeed_config_file: ds.json\nnum_processes: 1\n",
    "ok/ds.json": {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}},
    "multi/ds.json": {"train_micro_batch_size_per_gpu": 1,
                      "fp16": {"enabled": True, "loss_scale_window": 0, "loss_scale": -1},
                      "zero_optimization": {"stage": 3, "reduce_bucket_size": 0, "compute_grad_norm": False}},
}


@pytest.fixture(scope="module")
def oracle_run(tmp_path_factory):
    root = write_files(tmp_path_factory.mktemp("oracle"), FILES)
    result, launch = check([root], select={"OR000", "OR001", "OR002", "OR003"}, use_installed=False, oracle=True)
    by_file = {}
    for f in result.findings:
        by_file.setdefault(f.file.replace(str(root) + "/", ""), []).append(f)
    return by_file, launch


@pytest.mark.witness
@pytest.mark.slow
def test_or001_witness(oracle_run):
    """DeepSpeed's own DeepSpeedConfig refuses "sum" at ZeRO-3; the finding sits on the key, with its line."""
    by_file, launch = oracle_run
    [f] = by_file["raw/ds.json"]
    assert (f.code, f.key, f.line) == ("OR001", "gradient_allreduce_op", 3)
    assert "not supported with ZeRO stage 3" in f.message and launch.oracle.versions["deepspeed"]
    assert "ok/ds.json" not in by_file


@pytest.mark.witness
@pytest.mark.slow
def test_or002_witness(oracle_run):
    """transformers' mismatch check: the config's micro batch 4 against per_device_train_batch_size 2."""
    by_file, _ = oracle_run
    [f] = by_file["hf/ds.json"]
    assert (f.code, f.key) == ("OR002", "train_micro_batch_size_per_gpu") and "per_device_train_batch_size" in \
        f.message


@pytest.mark.witness
@pytest.mark.slow
def test_or003_witness(oracle_run):
    """accelerate's DeepSpeedPlugin refuses a DeepSpeed config without a zero_optimization section."""
    by_file, _ = oracle_run
    [f] = by_file["acc/ds.json"]
    assert f.code == "OR003" and "ZeRO optimization config" in f.message


def test_cases_carry_world_size_and_pairs(tmp_path):
    root = write_files(tmp_path, dict(FILES, **{"run.sh": "deepspeed --num_gpus 4 train.py\n"}))
    launch = load_launch([root], use_installed=False)
    by_path = {c["config"].get("train_micro_batch_size_per_gpu"): c for c in cases(launch)}
    assert by_path[4]["train_args"]["per_device_train_batch_size"] == 2
    assert all(c["world_size"] == 4 for c in cases(launch))


def test_or000_timeout(tmp_path):
    """A worker past its time limit is killed and reported as one warning."""
    root = write_files(tmp_path, {"ds.json": FILES["ok/ds.json"]})
    launch = load_launch([root], use_installed=False)
    launch.oracle = ask(launch, timeout_s=0.05)
    assert "did not answer within" in launch.oracle.failure
    from zeropilot.rules import get_rule

    [f] = get_rule("OR000").run(launch)
    assert f.severity.value == "warning"


def test_other_version_than_installed_is_a_warning(tmp_path):
    """A refusal by the installed DeepSpeed of a launch pinned to another version names both, as a warning."""
    from zeropilot.oracle import OracleReport, Refusal
    from zeropilot.rules import get_rule

    root = write_files(tmp_path, {"ds.json": FILES["raw/ds.json"]})
    launch = load_launch([root], versions="deepspeed=0.14.2", use_installed=False)
    [doc] = launch.ds_configs
    launch.oracle = OracleReport(verdicts={id(doc): [Refusal("deepspeed", "DeepSpeedConfig", "ValueError: x",
                                                             doc.get("gradient_allreduce_op"),
                                                             "gradient_allreduce_op")]},
                                 versions={"deepspeed": "0.19.8"})
    [f] = get_rule("OR001").run(launch)
    assert f.severity.value == "warning" and "the launch uses 0.14.2" in f.message and f.line == 3


def test_yaml_values_json_cannot_write_do_not_break_the_request(tmp_path):
    """A YAML DeepSpeed config with a date (not JSON) still makes a request the worker can read."""
    import json

    root = write_files(tmp_path, {"ds.yaml": "train_micro_batch_size_per_gpu: 1\nzero_optimization:\n  stage: 2\n"
                                             "steps_per_print: 10\n_comment: 2024-01-01\n"})
    launch = load_launch([root], use_installed=False)
    assert json.loads(json.dumps({"cases": cases(launch)}, default=str))["cases"]


@pytest.mark.witness
@pytest.mark.slow
def test_or001_every_refusal_of_a_config(oracle_run):
    """DeepSpeed stops at its first error; the worker drops the refused field and asks again: four refusals of one
    config, each on its own key (fields refused by pydantic models, and by model validators named in the message)."""
    by_file, _ = oracle_run
    assert sorted(f.key for f in by_file["multi/ds.json"]) == [
        "fp16.loss_scale", "fp16.loss_scale_window", "zero_optimization.compute_grad_norm",
        "zero_optimization.reduce_bucket_size"]

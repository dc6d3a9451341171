"""``zeropilot repro`` from the command line: the seed on CPU, its JSON, its table, its run directory; bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import write_files
from tests.zp import run_zeropilot
from zeropilot.cli import main
from zeropilot.repro.prepare import prepare
from zeropilot.repro.spec import SHRUNK, Options, fill_ds_config, shrink

REPO = Path(__file__).resolve().parents[2]
SEED = REPO / "examples" / "seed"


def _run(args, timeout=600):
    r = run_zeropilot(args, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


@pytest.fixture(scope="module")
def seed_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("seed") / "run"
    code, stdout, stderr = _run(["repro", str(SEED), "--cpu", "--nproc", "2", "--format", "json", "--out", str(out)])
    assert code == 0, stderr[-3000:]
    return json.loads(stdout), out


@pytest.mark.slow
def test_seed_resumes_exactly_on_cpu(seed_run):
    v, _ = seed_run
    from tests.cli.test_json_schemas import assert_documented, schema_errors

    assert_documented(v, "zeropilot.repro/1")  # the envelope and the keys docs/json-schema.md lists
    assert schema_errors(v, "repro.schema.json") == []
    assert v["resume_exact"] is True and v["differs"] == []
    assert v["spec"]["stage"] == 3 and v["spec"]["lora"]["rank"] == 16 and v["spec"]["precision"] == "bf16"
    assert [(s["step"], s["rank"]) for s in v["saves"]] == [(4, 0), (4, 1), (8, 0), (8, 1)]
    for s in v["saves"]:
        assert set(s) >= {"step", "rank", "bytes", "seconds"} and s["bytes"] > 0
    assert v["tolerance"]["kind"] == "bitwise"


@pytest.mark.slow
def test_seed_run_directory_opens_in_report(seed_run):
    _, out = seed_run
    code, stdout, stderr = _run(["report", str(out), "--format", "json"], timeout=120)
    assert code == 0, stderr
    report = json.loads(stdout)
    assert report["verdict"]["kind"] == "ok"
    assert report["steps"] == 12
    assert {(s["step"], s["rank"]) for s in report["saves"]} >= {(4, 0), (4, 1), (8, 0), (8, 1)}


@pytest.mark.slow
def test_seed_table_names_the_shape_and_the_verdict(seed_run):
    from zeropilot.repro.render import render

    v, _ = seed_run
    text = render(v)
    assert "shrunk for --cpu to qwen2 hidden 64" in text
    assert "resume: EXACT (bitwise)" in text
    assert text.count(" RSS ") >= 4  # one row per save and rank, host memory on CPU
    assert "stands in" in text  # the seed's model path does not exist here


def test_seed_spec_is_the_launch():
    spec, summary = prepare([str(SEED)], None, Options(cpu=True, nproc=2))
    assert (spec.stage, spec.precision, spec.micro_batch, spec.lora["rank"]) == (3, "bf16", 1, 16)
    assert spec.lora["target"] == "all-linear" and spec.gradient_checkpointing
    assert spec.scheduler == "cosine" and spec.warmup_steps == 2 and spec.lr == 1e-4
    # save_only_model + ZeRO-3 + gather false: the Trainer's save falls back to save_checkpoint with the frozen base
    assert spec.exclude_frozen is False
    assert spec.ds_config["gradient_accumulation_steps"] == spec.grad_accum == 2
    assert spec.ds_config["bf16"]["enabled"] is True and spec.ds_config["fp16"]["enabled"] is False
    assert summary["errors"] >= 1  # check runs first; the repro still runs what the launch would


def test_shrink_keeps_the_config_keys():
    big = {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
           "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064, "rope_theta": 1e6}
    small = shrink(big)
    assert set(big) <= set(small) and small["rope_theta"] == 1e6
    assert small["hidden_size"] == SHRUNK["hidden_size"] and small["num_hidden_layers"] == 2
    assert small["num_attention_heads"] % small["num_key_value_heads"] == 0


def test_auto_values_are_filled_as_the_hf_integration_fills_them():
    raw = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 1,
           "gradient_clipping": "auto", "bf16": {"enabled": "auto"},
           "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                                 "stage3_param_persistence_threshold": "auto", "sub_group_size": "auto"}}
    cfg, notes = fill_ds_config(raw, micro=1, ga=16, world=4, precision="bf16", hidden=64, max_grad_norm=1.0)
    assert (cfg["train_batch_size"], cfg["gradient_accumulation_steps"], cfg["gradient_clipping"]) == (64, 16, 1.0)
    z = cfg["zero_optimization"]
    assert (z["reduce_bucket_size"], z["stage3_prefetch_bucket_size"], z["stage3_param_persistence_threshold"]) == (
        4096, 3686, 640)
    assert "sub_group_size" not in z
    assert any("gradient_accumulation_steps=1" in n for n in notes)


@pytest.mark.parametrize("args, message", [
    (["/no/such/launch", "--cpu"], "no such"),
    (["{launch}", "--cpu", "--steps", "4", "--save-every", "4"], "--save-every 4 must be smaller"),
    (["{launch}", "--cpu", "--gpu-mem-cap", "16GiB"], "does not go with --cpu"),
    (["{launch}", "--gpu-mem-cap", "lots"], "expected a size"),
    (["{launch}", "--cpu", "--leave-out", "weights"], "--leave-out weights"),
    (["{train_only}", "--cpu"], "no DeepSpeed config"),
    (["{bad_json}", "--cpu"], "bad_json"),
    (["{launch}", "--model", "/no/such/config.json"], "cannot be read here"),
    (["{half_stage}", "--cpu"], "ZeRO stage cannot be known"),
    (["{launch}", "--cpu", "--out", "{launch}"], "holds no earlier repro"),
    (["{launch}", "--model", "qwen2-0.5b", "--nproc", "64"], "64 visible NVIDIA GPU(s)"),
])
def test_bad_input_is_one_message_and_exit_2(tmp_path, capsys, args, message):
    folders = {
        "launch": write_files(tmp_path / "launch", {"ds.json": {"zero_optimization": {"stage": 2}}}),
        "train_only": write_files(tmp_path / "train_only", {"train.yaml": "model_name_or_path: x\nstage: sft\n"
                                                            "finetuning_type: lora\n"}),
        "bad_json": write_files(tmp_path / "bad_json", {"ds.json": '{"zero_optimization": {"stage": 2,}'}),
        "half_stage": write_files(tmp_path / "half_stage", {"ds.json": {"zero_optimization": {"stage": 2.5}}}),
    }
    argv = ["repro"] + [a.format(**{k: str(v) for k, v in folders.items()}) for a in args]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("zeropilot: error: ") and err.count("\n") == 1, err
    assert message in err
    assert "Traceback" not in err


LF_HEAD = "model_name_or_path: m\nstage: sft\ntemplate: qwen\ndeepspeed: ds.json\noutput_dir: o\n"
HF_HEAD = "model_name_or_path: m\ndeepspeed: ds.json\noutput_dir: o\nper_device_train_batch_size: 1\n"


@pytest.mark.parametrize("files, target", [
    ({"train.yaml": LF_HEAD + "finetuning_type: lora\nlora_target: q_proj,v_proj\n"}, ["q_proj", "v_proj"]),
    ({"train.yaml": LF_HEAD + "finetuning_type: lora\n"}, "all-linear"),
    ({"train.yaml": HF_HEAD + "use_peft: true\nlora_r: 4\nlora_target_modules: [o_proj]\n"}, ["o_proj"]),
])
def test_lora_targets_come_from_the_launch_facts(tmp_path, files, target):
    """repro wraps the modules plan sizes: LLaMA-Factory's lora_target and TRL's lora_target_modules alike."""
    from zeropilot.launch import load_launch
    from zeropilot.repro.spec import _lora, launch_settings

    files = {**files, "ds.json": {"zero_optimization": {"stage": 2}}}
    settings = launch_settings(load_launch([write_files(tmp_path / "l", files)], use_installed=False))
    assert _lora(settings, Options(cpu=True))["target"] == target

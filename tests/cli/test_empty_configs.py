"""Every command that reads a launch refuses a config with no settings in it: one line, exit 2, nothing run; a
config that sets no training setting makes ``plan`` say what it assumed."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from zeropilot.cli import main
from zeropilot.launch.load import NO_SETTINGS

ROOT = Path(__file__).resolve().parents[2]
TRAIN = "import pathlib; pathlib.Path('ran').write_text('the launch ran')\n"


def _zp(args, cwd):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), ZEROPILOT_OFFLINE="1", NO_COLOR="1")
    return subprocess.run([sys.executable, "-m", "zeropilot", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=120)


@pytest.mark.parametrize("command", [
    ["check", "empty.yaml"],
    ["plan", "empty.yaml", "--model", "Qwen/Qwen2-7B", "--gpus", "4x16GiB"],
    ["repro", "empty.yaml", "--cpu", "--nproc", "1", "--out", "repro-out"],
    ["run", "--out", "run-out", "--", sys.executable, "train.py", "--deepspeed", "empty.yaml"],
], ids=["check", "plan", "repro", "run"])
def test_an_empty_yaml_is_one_line_and_exit_2(tmp_path, command):
    (tmp_path / "empty.yaml").write_text("  \n# nothing yet\n")
    (tmp_path / "train.py").write_text(TRAIN)
    r = _zp(command, tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    said = (r.stdout if command[0] == "check" else r.stderr).splitlines()
    assert [line for line in said if NO_SETTINGS in line][0].count("empty.yaml") == 1
    assert "Traceback" not in r.stderr and not (tmp_path / "ran").exists()
    if command[0] != "check":
        assert len(r.stderr.splitlines()) == 1 and not r.stdout
    assert not (tmp_path / "run-out" / "run.json").exists()


def test_run_with_no_check_starts_anyway(tmp_path):
    """``--no-check`` is the way past what check cannot read: the launch runs (and meets the file itself)."""
    (tmp_path / "empty.yaml").write_text("")
    (tmp_path / "train.py").write_text(TRAIN)
    r = _zp(["run", "--no-check", "--out", "d", "--", sys.executable, "train.py", "--deepspeed", "empty.yaml"],
            tmp_path)
    assert r.returncode == 0 and (tmp_path / "ran").exists(), r.stderr


def _notes(capsys, *argv):
    assert main(["plan", *argv, "--model", "Qwen/Qwen2-7B", "--gpus", "4x16GiB", "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)["notes"]


@pytest.fixture
def says_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("ZEROPILOT_OFFLINE", "1")
    (tmp_path / "ds.json").write_text("{}")
    (tmp_path / "train.yaml").write_text("model_name_or_path: Qwen/Qwen2-7B\noutput_dir: out\n")
    return tmp_path


@pytest.mark.parametrize("name", ["ds.json", "train.yaml"])
def test_plan_of_a_launch_that_sets_nothing_names_what_it_assumed(says_nothing, capsys, name):
    note = _notes(capsys, str(says_nothing / name))[0]
    assert note.startswith(f"{says_nothing / name} sets no training setting the plan reads: it assumed ZeRO-2, "
                           "full fine-tuning, micro batch 1, 2048 tokens per sample, gradient accumulation 1, ")
    assert note.endswith("pass --stage, --lora-rank, --micro-batch, --seq-len, --grad-accum, --gradient-checkpointing, "
                         "--offload-optimizer, --offload-param")


def test_plan_names_only_the_defaults_no_flag_gave(says_nothing, capsys):
    note = _notes(capsys, str(says_nothing / "ds.json"), "--stage", "3", "--lora-rank", "8", "--seq-len", "512")[0]
    assert "ZeRO" not in note and "fine-tuning" not in note and "tokens" not in note and "--stage" not in note
    assert "micro batch 1" in note and "--micro-batch" in note
    every = ["--stage", "3", "--lora-rank", "8", "--seq-len", "512", "--micro-batch", "1", "--grad-accum", "1",
             "--no-gradient-checkpointing", "--offload-optimizer", "none", "--offload-param", "none"]
    assert not any("sets no training setting" in n for n in _notes(capsys, str(says_nothing / "ds.json"), *every))


def test_a_launch_with_settings_gets_no_such_note(capsys, monkeypatch):
    monkeypatch.setenv("ZEROPILOT_OFFLINE", "1")
    for example in ("seed", "healthy", "raw-deepspeed"):
        assert not any("sets no training setting" in n for n in _notes(capsys, str(ROOT / "examples" / example)))

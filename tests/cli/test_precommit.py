"""The pre-commit hook (``.pre-commit-hooks.yaml``) and ``check --format github``.

The hook's ``files`` pattern is tested on the examples and on names it must leave alone; the whole path is tested
for real with ``pre-commit try-repo`` against this checkout on a copy of ``examples/seed`` in a git repository of
its own (pre-commit builds the hook's virtual environment from this checkout with pip, as a user's would).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.zp import run_group
from zeropilot.cli import main

REPO = Path(__file__).resolve().parents[2]
SEED = REPO / "examples" / "seed"


def _hook() -> dict:
    hooks = yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text(encoding="utf-8"))
    assert [h["id"] for h in hooks] == ["zeropilot-check"]
    return hooks[0]


def _selected(hook: dict, names):
    files, exclude = re.compile(hook["files"]), re.compile(hook["exclude"])
    return sorted(n for n in names if files.search(n) and not exclude.search(n))


def test_the_hook_selects_launch_files_and_leaves_others_alone():
    hook = _hook()
    assert hook["entry"] == "zeropilot check" and hook["language"] == "python" and hook["require_serial"]
    seed = sorted(p.name for p in SEED.iterdir())
    assert _selected(hook, seed) == ["deepspeed_z3_offload_4x16g.json", "pip-freeze.txt", "run.sh"]
    launches = ["examples/healthy/ds_z2.json", "examples/healthy/qwen2_lora_sft.yaml", "configs/ds_config.json",
                "examples/deepspeed/ds_z3_offload_config.json", "examples/accelerate_configs/deepspeed_zero3.yaml",
                "accelerate/default_config.yaml", "examples/train_lora/llama3_lora_sft.yaml", "scripts/train.sh",
                "requirements.txt", "env/pip_freeze.txt", "zero2.json", "configs/fsdp.yaml"]
    others = ["package.json", "tsconfig.json", "README.md", "src/app.py", ".github/workflows/ci.yml",
              "data/alpaca_en.json", "model/config.json", "model/tokenizer.json", "docs/mkdocs.yml",
              "node_modules/x/train.json", "out/checkpoint-500/trainer_state.json", "wandb/run-1/config.yaml"]
    assert _selected(hook, launches) == sorted(launches)
    assert _selected(hook, others) == []


def test_the_hooks_command_flags_the_seed(tmp_path, monkeypatch, capsys):
    """What pre-commit runs in a repository holding the seed: its entry on the files it selects (it follows the
    training YAML from run.sh)."""
    hook = _hook()
    shutil.copytree(SEED, tmp_path / "seed")
    monkeypatch.chdir(tmp_path / "seed")
    files = _selected(hook, sorted(os.listdir(".")))
    assert main([*hook["entry"].split()[1:], *files, "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert {"HF001", "SH001", "TO001"} <= {f["code"] for f in doc["findings"]}
    assert any(p.endswith("binding_paired_000.yaml") for p in doc["files"])


@pytest.mark.slow
def test_pre_commit_try_repo_flags_the_seed(tmp_path):
    """``pre-commit try-repo`` with this checkout's hook (uncommitted changes included) fails on the seed."""
    pytest.importorskip("pre_commit")
    if not (REPO / ".git").exists():
        pytest.skip("try-repo needs this checkout to be a git repository")
    repo = tmp_path / "repo"
    shutil.copytree(SEED, repo)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PRE_COMMIT_HOME=str(tmp_path / "cache"), GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t", PIP_DISABLE_PIP_VERSION_CHECK="1")
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-q", "-m", "seed"]):
        subprocess.run(cmd, cwd=repo, env=env, check=True, timeout=60)
    ran = run_group([sys.executable, "-m", "pre_commit", "try-repo", str(REPO), "zeropilot-check", "--all-files"],
                    timeout=600, env=env, cwd=repo)
    out = ran.stdout + ran.stderr
    assert ran.returncode == 1, out[-4000:]
    assert re.search(r"zeropilot check \(DeepSpeed ZeRO launch\)\.+Failed", out), out[-4000:]
    assert "HF001 deepspeed-value-contradicts-training-args" in out and "Traceback" not in out


def test_check_github_annotations(tmp_path, monkeypatch, capsys):
    shutil.copytree(SEED, tmp_path / "seed")
    monkeypatch.chdir(tmp_path)
    assert main(["check", "seed", "--format", "github", "--gpus", "none"]) == 1
    lines = capsys.readouterr().out.splitlines()
    hf001 = [ln for ln in lines if "HF001" in ln]
    assert len(hf001) == 1 and hf001[0].startswith(
        "::error file=seed/deepspeed_z3_offload_4x16g.json,line=4,")
    assert ",title=HF001 deepspeed-value-contradicts-training-args (gradient_accumulation_steps)::" in hf001[0]
    assert all(ln.startswith(("::error ", "::warning ", "::notice ")) for ln in lines[:-1])
    assert lines[-1].startswith("zeropilot check: ")


def test_github_annotations_cannot_be_broken_by_a_message():
    from zeropilot.findings.github import _command

    line = _command("error", "50%\nline two\r::warning::x", "a,b:c.json", 3, 1, "T: a, b")
    assert "\n" not in line and "\r" not in line
    assert line == "::error file=a%2Cb%3Ac.json,line=3,col=1,title=T%3A a%2C b::50%25%0Aline two%0D::warning::x"


def test_sarif_for_code_scanning_names_files_relative_to_the_repository(tmp_path, monkeypatch, capsys):
    """upload-sarif matches results to files by relative URI, and refuses a helpUri that is not absolute."""
    shutil.copytree(SEED, tmp_path / "seed")
    monkeypatch.chdir(tmp_path)
    assert main(["check", ".", "--format", "sarif", "--gpus", "none"]) == 1
    run, = json.loads(capsys.readouterr().out)["runs"]
    uris = {loc["physicalLocation"]["artifactLocation"]["uri"] for r in run["results"] for loc in r["locations"]}
    assert uris == {"seed/binding_paired_000.yaml", "seed/deepspeed_z3_offload_4x16g.json", "seed/run.sh"}
    assert all("helpUri" not in rule for rule in run["tool"]["driver"]["rules"])

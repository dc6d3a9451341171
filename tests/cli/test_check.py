"""`zeropilot check` as a user runs it: formats, exit codes, bad input, no heavy imports."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import write_files
from zeropilot.cli import main

ROOT = Path(__file__).resolve().parents[2]
BOTH = {"fp16": {"enabled": True}, "bf16": {"enabled": True}, "zero_optimization": {"stage": 2}}


def run_cli(*args, cwd=None):
    proc = subprocess.run([sys.executable, "-m", "zeropilot", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd or ROOT, env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1",
                                                "PYTHONPATH": str(ROOT / "src")})
    return proc


def test_json_format_and_exit_1(tmp_path, capsys):
    root = write_files(tmp_path, {"ds.json": BOTH})
    code = main(["check", str(root), "--format", "json", "--versions", "deepspeed=0.19.8"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1
    f, = [f for f in out["findings"] if f["code"] == "DS005"]
    assert {k: f[k] for k in ("severity", "key", "line")} == {"severity": "error", "key": "bf16.enabled",
                                                               "line": 6}
    assert f["file"].endswith("ds.json") and f["versions"] == {"deepspeed": "0.19.8"}
    assert out["versions"]["deepspeed"] == {"version": "0.19.8", "source": "--versions"}
    assert out["summary"]["errors"] >= 1


def test_fail_on_levels(tmp_path):
    root = write_files(tmp_path, {"ds.json": {"zero_optimization": {"stage": 2}}})
    assert main(["check", str(root), "--format", "json"]) == 0
    assert main(["check", str(root), "--select", "DS005"]) == 0


def test_sarif_is_2_1_0(tmp_path, capsys):
    root = write_files(tmp_path, {"ds.json": BOTH})
    main(["check", str(root), "--format", "sarif", "--select", "DS005"])
    sarif = json.loads(capsys.readouterr().out)
    assert sarif["version"] == "2.1.0"
    run, = sarif["runs"]
    result, = run["results"]
    assert result["ruleId"] == "DS005" and result["level"] == "error"
    assert result["locations"][0]["physicalLocation"]["region"]["startLine"] == 6
    assert run["tool"]["driver"]["rules"][result["ruleIndex"]]["id"] == "DS005"


def test_text_is_80_columns_without_colour_when_piped(tmp_path):
    root = write_files(tmp_path, {"ds.json": BOTH})
    proc = run_cli("check", root)
    assert proc.returncode == 1
    assert "\033[" not in proc.stdout
    assert max(len(line) for line in proc.stdout.splitlines()) <= 80
    assert "DS005 fp16-and-bf16-both-enabled" in proc.stdout


@pytest.mark.parametrize("content, expect", [
    (b"{\"a\": ", "ds.json:1:7: not valid JSON"),
    (b"\x00\x00\x00", "a binary file"),
    (b"\xff\xfe{}", "not UTF-8"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, content, expect):
    path = tmp_path / "ds.json"
    path.write_bytes(content)
    proc = run_cli("check", path)
    assert proc.returncode == 2
    assert expect in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("args, expect", [
    (["check", "/nonexistent/x.json"], "no such file"),
    (["check", "examples/seed", "--versions", "deepspeed"], "expected NAME=VERSION"),
    (["check", "examples/seed", "--world-size", "0"], "at least 1"),
    (["explain", "XX999"], "no rule"),
    (["check", "examples/healthy", "--gpus", "banana"], "--gpus"),
])
def test_bad_arguments(args, expect):
    proc = run_cli(*args)
    assert proc.returncode == 2 and expect in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_check_imports_no_heavy_library():
    code = ("import sys; from zeropilot.cli import main; "
            "main(['check', 'examples/seed', '--format', 'json']); "
            "heavy = [m for m in ('torch', 'deepspeed', 'transformers', 'accelerate', 'peft') if m in sys.modules]; "
            "assert not heavy, heavy")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_rules_and_explain(capsys):
    assert main(["rules"]) == 0
    assert "DS005" in capsys.readouterr().out
    assert main(["explain", "fp16-and-bf16-both-enabled"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# DS005") and "## Why is this bad?" in out


def test_huge_file_refused(tmp_path, capsys):
    path = tmp_path / "ds.json"
    path.write_text('{"a": "' + "x" * (9 * 1024 * 1024) + '"}')
    assert main(["check", str(path)]) == 2
    assert "larger than 8 MiB" in capsys.readouterr().out


def test_empty_files(tmp_path, capsys):
    write_files(tmp_path, {"ds.json": "", "train.yaml": "", "run.sh": ""})
    assert main(["check", str(tmp_path)]) == 2
    out = capsys.readouterr().out
    assert "ds.json:1:1: not valid JSON: the file is empty" in out


from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=300), suffix=st.sampled_from([".json", ".yaml", ".sh", ".py", ".conf"]))
def test_fuzz_check_any_bytes(tmp_path, data, suffix):
    from zeropilot.check import check

    path = tmp_path / f"f{suffix}"
    path.write_bytes(data)
    result, _ = check([path], use_installed=False)
    assert result.exit_code(None) in (0, 2)


SEED_VERSIONS = "deepspeed=0.14.2+das.opt1.dtk25041,torch=2.4.1+das.opt1.dtk25041,transformers=4.46.1"


def test_diff_then_fix_on_the_seed(tmp_path, capsys):
    import shutil

    seed = tmp_path / "seed"
    shutil.copytree(ROOT / "examples" / "seed", seed)
    before = {p.name: (p.read_text(), p.stat().st_mtime_ns) for p in seed.iterdir()}
    assert main(["check", str(seed), "--diff", "--versions", SEED_VERSIONS]) == 1
    diff = capsys.readouterr().out
    assert '-  "gradient_accumulation_steps": 1,' in diff and '+  "gradient_accumulation_steps": "auto",' in diff
    assert {p.name: p.read_text() for p in seed.iterdir()} == {k: v[0] for k, v in before.items()}

    main(["check", str(seed), "--fix", "--versions", SEED_VERSIONS, "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    assert out["summary"]["fixed"] == 1 and "HF001" not in {f["code"] for f in out["findings"]}
    ds = seed / "deepspeed_z3_offload_4x16g.json"
    old = before[ds.name][0]
    assert ds.read_text() == old.replace('"gradient_accumulation_steps": 1,', '"gradient_accumulation_steps": "auto",')
    for p in seed.iterdir():  # nothing else was touched
        if p != ds:
            assert p.stat().st_mtime_ns == before[p.name][1]
    assert sorted(p.name for p in seed.iterdir()) == sorted(before)  # no temporary files left
    assert main(["check", str(seed), "--diff", "--versions", SEED_VERSIONS]) == 0  # nothing left to fix

"""Every command's ``--format json`` carries the versioned envelope and exactly the keys ``docs/json-schema.md``
documents for it: the tables there are parsed, so the documentation and the output cannot drift apart.

``repro`` is validated by the seed run of ``tests/repro/test_repro_cli.py`` (it calls :func:`assert_documented`
and :func:`schema_errors`), ``top`` by the live job of ``tests/cli/test_top.py``, the report's full contract by
``tests/report`` (``docs/report.schema.json``). The other schema files (``docs/*.schema.json``) are validated
here against real output, and their keys against the tables.

Every command that prints results has a JSON form and a schema file (:data:`COMMAND_SCHEMAS`; a test fails for a
registered command missing from it): ``check``, ``rules``, ``explain``, ``plan``, ``ckpt inspect``, ``ckpt export``,
``ckpt verify``, ``report`` and ``run`` (the same document), ``top``, ``repro``, ``calibrate``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterable, Set

import pytest

from tests.zp import run_zeropilot
from zeropilot import __version__
from zeropilot.cli import main

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "json-schema.md"
CKPT_FIXTURE = REPO / "tests" / "data" / "checkpoints" / "ds0.14.4_z2_w2_bf16" / "run"

_HEADING = re.compile(r"^## `(zeropilot\.[a-z-]+/\d+)`", re.M)
_NAME = re.compile(r"`([a-z_]+)`")


def documented_keys() -> Dict[str, Set[str]]:
    """schema → the top-level keys of its first table in docs/json-schema.md."""
    text = DOC.read_text(encoding="utf-8")
    heads = list(_HEADING.finditer(text))
    out: Dict[str, Set[str]] = {}
    for head, nxt in zip(heads, heads[1:] + [None]):
        section = text[head.end():nxt.start() if nxt else len(text)]
        rows = re.search(r"\| field \|.*?\n((?:\|.*\n)+)", section)
        assert rows, f"{head.group(1)}: no field table"
        out[head.group(1)] = {name for row in rows.group(1).splitlines()[1:]
                              for name in _NAME.findall(row.split("|")[1])}
    return out


def assert_documented(doc: dict, schema: str, optional: Iterable[str] = ()) -> None:
    """``doc`` is ``schema`` in the envelope; its keys are the documented ones (``optional`` may be absent)."""
    assert doc["schema"] == schema and list(doc)[:2] == ["schema", "tool"]
    assert doc["tool"] == {"name": "zeropilot", "version": __version__}
    documented = documented_keys()[schema]
    keys = set(doc) - {"schema", "tool"}
    assert keys - documented == set(), "printed but not documented"
    assert documented - set(optional) - keys == set(), "documented but not printed"


SCHEMA_FILES = sorted((REPO / "docs").glob("*.schema.json"))


def schema_errors(doc: dict, file_name: str) -> list:
    """Errors of ``doc`` against ``docs/<file_name>`` (JSON Schema draft 2020-12)."""
    from jsonschema import Draft202012Validator

    schema = json.loads((REPO / "docs" / file_name).read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in Draft202012Validator(schema).iter_errors(doc)]


@pytest.mark.parametrize("path", [p for p in SCHEMA_FILES if p.name != "report.schema.json"], ids=lambda p: p.name)
def test_schema_files_hold_the_documented_keys(path):
    """A schema file and the table of docs/json-schema.md name the same top-level keys (one contract)."""
    schema = json.loads(path.read_text(encoding="utf-8"))
    name = schema["properties"]["schema"]["const"]
    keys = set(schema["properties"]) - {"schema", "tool"}
    assert keys == documented_keys()[name]
    optional = {"zeropilot.plan/1": {"search", "search_closest"}}.get(name, set())  # with --search only
    assert set(schema["required"]) == set(schema["properties"]) - optional
    assert schema["additionalProperties"] is False


#: command (as ``zeropilot --help`` lists it; ``ckpt`` by subcommand) -> the schema file of its JSON output.
COMMAND_SCHEMAS = {
    "check": "check.schema.json", "rules": "rules.schema.json", "explain": "explain.schema.json",
    "plan": "plan.schema.json", "ckpt inspect": "ckpt-inspect.schema.json", "ckpt export": "ckpt-export.schema.json",
    "ckpt verify": "ckpt-verify.schema.json", "ckpt universal": "ckpt-universal.schema.json",
    "report": "report.schema.json", "run": "report.schema.json",
    "top": "top.schema.json", "repro": "repro.schema.json", "calibrate": "calibrate.schema.json",
}


def _commands() -> Set[str]:
    import argparse

    from zeropilot.cli import build_parser

    def subparsers(parser):
        return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)

    out = set()
    for name, sub in subparsers(build_parser()).choices.items():
        nested = subparsers(sub)
        out |= {f"{name} {n}" for n in nested.choices} if nested else {name}
    return out


def test_every_command_has_json_and_a_schema_file():
    """No command that prints results is left without ``--format json`` and its schema file."""
    from zeropilot.cli import build_parser

    assert _commands() == set(COMMAND_SCHEMAS)
    for command, file_name in COMMAND_SCHEMAS.items():
        assert (REPO / "docs" / file_name).is_file(), file_name
        args = build_parser().parse_args([*command.split(), "--format", "json", *_POSITIONAL.get(command, [])])
        assert args.format == "json", command


_POSITIONAL = {"explain": ["DS005"], "ckpt inspect": ["P"], "ckpt export": ["P", "O"], "ckpt universal": ["P", "O"],
               "ckpt verify": ["O", "--against", "P"], "report": ["D"], "top": ["D"], "repro": ["L"],
               "run": ["--", "true"]}


def _zp(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return run_zeropilot(argv, timeout=timeout, env={"DS_ACCELERATOR": "cpu"})


def test_every_documented_schema_has_a_field_table():
    assert set(documented_keys()) >= {"zeropilot.check/1", "zeropilot.rules/1", "zeropilot.plan/1",
                                      "zeropilot.calibrate/1", "zeropilot.repro/1", "zeropilot.report/1",
                                      "zeropilot.ckpt-inspect/1", "zeropilot.explain/1", "zeropilot.top/1"}


@pytest.mark.parametrize("search", [False, True])
def test_plan_json(capsys, search):
    argv = ["plan", "--model", "qwen2.5-7b", "--gpus", "1x80GiB", "--stage", "3", "--host-mem", "64"]
    assert main(argv + (["--search"] if search else []) + ["--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert_documented(doc, "zeropilot.plan/1", optional=() if search else ("search", "search_closest"))
    assert schema_errors(doc, "plan.schema.json") == []
    assert doc["inputs"]["stage"] == 3 and doc["sources"]["stage"] == "flag --stage"


@pytest.mark.slow
def test_calibrate_json_on_cpu(tmp_path):
    profile = tmp_path / "p.json"
    r = _zp("calibrate", "--nproc", "1", "--out", str(profile), "--checkpoint-dir", str(tmp_path),
            "--disk-mib", "4", "--no-cpu-adam", "--format", "json", timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert_documented(doc, "zeropilot.calibrate/1")
    assert schema_errors(doc, "calibrate.schema.json") == []
    assert doc["path"] == str(profile) and doc["vendor"] == "cpu"
    written = json.loads(profile.read_text())  # the file plan loads keeps its own format version
    assert written["schema"] == doc["profile_schema"] == 1
    assert {k: v for k, v in written.items() if k != "schema"} == {
        k: v for k, v in doc.items() if k not in ("schema", "tool", "profile_schema", "path")}


def test_run_json_is_the_report_and_keeps_stdout_clean(tmp_path, capsys):
    out = tmp_path / "run"
    r = _zp("run", "--format", "json", "--out", str(out), "--", sys.executable, "-c", "print('job says', 'hi')")
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)  # the job's own output went to stderr
    assert "job says hi" in r.stderr and "job says hi" not in r.stdout
    assert_documented(doc, "zeropilot.report/1", optional=["checkpoint"])  # report --checkpoint only
    assert doc["verdict"]["kind"] == "ok" and doc["exit_code"] == 0
    assert main(["report", str(out), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == doc


def test_report_out_file_is_written_atomically_and_readable(tmp_path, capsys):
    out = tmp_path / "run"
    assert _zp("run", "--out", str(out), "--", sys.executable, "-c", "pass").returncode == 0
    target = tmp_path / "report.json"
    assert main(["report", str(out), "--format", "json", "--out", str(target)]) == 0
    assert json.loads(target.read_text())["schema"] == "zeropilot.report/1"
    assert target.stat().st_mode & 0o777 == 0o644 and [p.name for p in tmp_path.iterdir()].count("report.json") == 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".report.json.")]
    capsys.readouterr()
    assert main(["report", str(out), "--out", str(tmp_path / "no" / "such" / "r.txt")]) == 2
    assert "no such folder" in capsys.readouterr().err


def test_ckpt_inspect_json(capsys):
    code = main(["ckpt", "inspect", str(CKPT_FIXTURE), "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert_documented(doc, "zeropilot.ckpt-inspect/1")
    assert schema_errors(doc, "ckpt-inspect.schema.json") == []
    assert code == 0 and doc["verdict"] == "ok" and doc["stage"] == 2 and doc["world_size"] == 2


def test_ckpt_inspect_json_of_a_damaged_checkpoint(tmp_path, capsys):
    import shutil

    run = shutil.copytree(CKPT_FIXTURE, tmp_path / "run")
    victim = next((run / "global_step2").glob("*optim_states.pt"))
    victim.write_bytes(victim.read_bytes()[:100])  # truncated
    assert main(["ckpt", "inspect", str(run), "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "damaged" and doc["problems"]
    assert schema_errors(doc, "ckpt-inspect.schema.json") == []


def test_check_json_holds_its_schema(tmp_path, capsys):
    """The seed (findings with and without fixes, a world size from its launcher), and a folder with an unreadable
    config (read_errors) and a skipped file."""
    assert main(["check", str(REPO / "examples" / "seed"), "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["findings"] and schema_errors(doc, "check.schema.json") == []
    assert any(f["fix"] for f in doc["findings"]) and doc["world_size"]["value"] == 4
    (tmp_path / "ds_config.json").write_text('{"zero_optimization": {"stage": ')
    (tmp_path / "tokenizer.json").write_text("{}")
    main(["check", str(tmp_path), "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["read_errors"] and schema_errors(doc, "check.schema.json") == []


def test_explain_json_holds_its_schema(capsys):
    assert main(["explain", "DS005", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert schema_errors(doc, "explain.schema.json") == []
    assert doc["rule"]["code"] == "DS005" and doc["markdown"].startswith("# DS005 ")
    assert main(["rules", "--format", "json", "--select", "DS005"]) == 0
    assert json.loads(capsys.readouterr().out)["rules"] == [doc["rule"]]  # one record for one rule


def test_rules_json_holds_its_schema(capsys):
    assert main(["rules", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert schema_errors(doc, "rules.schema.json") == []
    assert len(doc["rules"]) > 20 and doc["rules"] == sorted(doc["rules"], key=lambda r: r["code"])


def test_the_calibrate_schema_accepts_the_shipped_h200_profile(tmp_path):
    """The schema holds for a GPU profile too (the CPU run above leaves the GPU fields null)."""
    from zeropilot.cli.calibrate import document
    from zeropilot.memory.profile import load

    profile = load(str(REPO / "src" / "zeropilot" / "data" / "hardware" / "nvidia-h200-ws1.json"))
    doc = json.loads(json.dumps(document(profile, tmp_path / "p.json")))
    assert schema_errors(doc, "calibrate.schema.json") == []
    assert doc["gpu_name"] == "NVIDIA H200" and doc["outside_torch_bytes"] > 0


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The fixture checkpoint exported with ``--format json`` (the document and OUT)."""
    out = tmp_path_factory.mktemp("export") / "out"
    r = _zp("ckpt", "export", str(CKPT_FIXTURE), str(out), "--format", "json", "--no-progress")
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout), out


def test_ckpt_export_json(exported):
    doc, out = exported
    assert_documented(doc, "zeropilot.ckpt-export/1")
    assert schema_errors(doc, "ckpt-export.schema.json") == []
    assert doc["verdict"] == "ok" and doc["out"] == str(out) and doc["problems"] == []
    assert (out / doc["files"][0]).is_file() and doc["tensors"] > 0 and doc["bytes"] > 0


def test_ckpt_verify_json_ok_and_mismatch(exported, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    _doc, out = exported
    assert main(["ckpt", "verify", str(out), "--against", str(CKPT_FIXTURE), "--format", "json"]) == 0
    ok = json.loads(capsys.readouterr().out)
    assert_documented(ok, "zeropilot.ckpt-verify/1")
    assert schema_errors(ok, "ckpt-verify.schema.json") == []
    assert ok["verdict"] == "ok" and ok["compared"] > 0 and ok["mismatched"] == []
    changed = tmp_path / "changed"
    changed.mkdir()
    tensors = load_file(str(out / "model.safetensors"))
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + 1
    save_file(tensors, str(changed / "model.safetensors"))
    assert main(["ckpt", "verify", str(changed), "--against", str(CKPT_FIXTURE), "--format", "json"]) == 1
    bad = json.loads(capsys.readouterr().out)
    assert schema_errors(bad, "ckpt-verify.schema.json") == []
    assert bad["verdict"] == "mismatch" and bad["mismatched"] == [name]


def test_ckpt_export_and_verify_json_of_a_damaged_checkpoint(exported, tmp_path, capsys):
    import shutil

    _doc, out = exported
    damaged = tmp_path / "ckpt"
    shutil.copytree(CKPT_FIXTURE, damaged)
    (damaged / "global_step2" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    assert main(["ckpt", "export", str(damaged), str(tmp_path / "out"), "--format", "json", "--no-progress"]) == 1
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert schema_errors(doc, "ckpt-export.schema.json") == []
    assert doc["verdict"] == "damaged" and doc["out"] is None and not (tmp_path / "out").exists()
    assert any("bf16_zero_pp_rank_1" in p for p in doc["problems"]) and "verdict: DAMAGED" in captured.err
    assert main(["ckpt", "verify", str(out), "--against", str(damaged), "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert schema_errors(doc, "ckpt-verify.schema.json") == []
    assert doc["verdict"] == "damaged" and doc["compared"] == 0 and doc["problems"]


def test_ckpt_universal_json(tmp_path):
    """``ckpt universal --format json`` on the fixture checkpoint: its documented keys, its schema, and OUT as said."""
    out = tmp_path / "universal"
    r = _zp("ckpt", "universal", str(CKPT_FIXTURE), str(out), "--format", "json", "--no-progress")
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert_documented(doc, "zeropilot.ckpt-universal/1")
    assert schema_errors(doc, "ckpt-universal.schema.json") == []
    assert doc["out"] == str(out) and (out / "latest_universal").read_text().strip() == doc["tag"]
    assert doc["stage"] == 2 and doc["saved_world_size"] == 2 and doc["parameters"] > 0

"""Every command's ``--format json`` carries the versioned envelope and exactly the keys ``docs/json-schema.md``
documents for it: the tables there are parsed, so the documentation and the output cannot drift apart.

``check`` and ``rules`` are covered in ``test_interface.py``, ``repro`` by the seed run of
``tests/repro/test_repro_cli.py`` (it calls :func:`assert_documented`), the report's full contract by
``tests/report`` (``docs/report.schema.json``).
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


def _zp(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return run_zeropilot(argv, timeout=timeout, env={"DS_ACCELERATOR": "cpu"})


def test_every_documented_schema_has_a_field_table():
    assert set(documented_keys()) >= {"zeropilot.check/1", "zeropilot.rules/1", "zeropilot.plan/1",
                                      "zeropilot.calibrate/1", "zeropilot.repro/1", "zeropilot.report/1",
                                      "zeropilot.ckpt-inspect/1"}


@pytest.mark.parametrize("search", [False, True])
def test_plan_json(capsys, search):
    argv = ["plan", "--model", "qwen2.5-7b", "--gpus", "1x80GiB", "--stage", "3", "--host-mem", "64"]
    assert main(argv + (["--search"] if search else []) + ["--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert_documented(doc, "zeropilot.plan/1", optional=() if search else ("search", "search_closest"))
    assert doc["inputs"]["stage"] == 3 and doc["sources"]["stage"] == "flag --stage"


@pytest.mark.slow
def test_calibrate_json_on_cpu(tmp_path):
    profile = tmp_path / "p.json"
    r = _zp("calibrate", "--nproc", "1", "--out", str(profile), "--checkpoint-dir", str(tmp_path),
            "--disk-mib", "4", "--format", "json", timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert_documented(doc, "zeropilot.calibrate/1")
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
    assert_documented(doc, "zeropilot.report/1")
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
    assert code == 0 and doc["verdict"] == "ok" and doc["stage"] == 2 and doc["world_size"] == 2

"""Fixtures of the report tests: synthetic run directories (written once per session) and the schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.report.synth import Spec, write_run

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "docs" / "report.schema.json"


@pytest.fixture(scope="session")
def synth_dirs(tmp_path_factory):
    """A healthy 2-rank run, one where rank 1 runs out of memory after a save, one where rank 2 hangs."""
    base = tmp_path_factory.mktemp("runs")
    return {"ok": write_run(base / "ok", Spec()),
            "oom": write_run(base / "oom", Spec(oom_rank=1)),
            "hang": write_run(base / "hang", Spec(ranks=3, hang_rank=2))}


@pytest.fixture(scope="session")
def validate():
    """Validate a report object against docs/report.schema.json; returns the list of errors."""
    from jsonschema import Draft202012Validator

    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    validator = Draft202012Validator(schema)

    def errors(obj):
        return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]
    return errors

"""Fixtures shared by the rule tests."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def engine_probe():
    """One real ZeRO-2 engine (gloo, one process) built in a fresh process, once per session; what it reported.

    See ``tests.rules.test_deepspeed_config.engine_probe_main`` for what is probed.
    """
    code = ("import json; from tests.rules.test_deepspeed_config import engine_probe_main as m; "
            "print('PROBE ' + json.dumps(m(2)))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "DS_ACCELERATOR": "cpu"})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE ")]
    assert lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("PROBE "):])

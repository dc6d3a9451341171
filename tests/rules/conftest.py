"""Fixtures shared by the rule tests."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.once import once, shared_dir
from tests.zp import extensions_dir

ROOT = Path(__file__).resolve().parents[2]


@once
def _engine_probe() -> dict:
    code = ("import json; from tests.rules.test_deepspeed_config import engine_probe_main as m; "
            "print('PROBE ' + json.dumps(m(2)))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "DS_ACCELERATOR": "cpu"})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE ")]
    assert lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("PROBE "):])


@pytest.fixture(scope="session")
def engine_probe():
    """One real ZeRO-2 engine (gloo, one process) built in a fresh process, once per test run; what it reported.

    See ``tests.rules.test_deepspeed_config.engine_probe_main`` for what is probed.
    """
    return _engine_probe()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_probe(module: str, args, out: Path, timeout: float = 300) -> str:
    """Run ``python -m module *args`` in its own process group (killed on every path); returns its output."""
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "MASTER_PORT": str(_free_port()),
           "TORCH_EXTENSIONS_DIR": extensions_dir(out / "torch_extensions")}
    proc = subprocess.Popen([sys.executable, "-m", module, *map(str, args)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    return log


@once
def _probe(module: str, name: str) -> dict:
    """What ``python -m module OUT/probe.json`` wrote, run once per test run in the run's shared folder."""
    out = shared_dir(name)
    args = [out] if name == "accelerate_probe" else [out / "probe.json"]
    log = run_probe(module, args, out)
    assert (out / "probe.json").exists(), log[-3000:]
    return json.loads((out / "probe.json").read_text())


@pytest.fixture(scope="session")
def accelerate_probe():
    """What accelerate did with each case of ``tests/rules/accelerate_probe.py`` (one process, one rank)."""
    return _probe("tests.rules.accelerate_probe", "accelerate_probe")


@pytest.fixture(scope="session")
def init_probe():
    """What ``deepspeed.initialize`` did with each case of ``tests/rules/init_probe.py`` (one process, one rank)."""
    return _probe("tests.rules.init_probe", "init_probe")

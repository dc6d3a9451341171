"""Run a command (``python -m zeropilot ARGS`` among them) in its own session, killed with its children on every path."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
#: the suite's ``sitecustomize`` (it keeps MLflow out of DeepSpeed's import): on every child's PYTHONPATH
SITE = REPO / "tests" / "site"
#: set for every process of the suite (tests/conftest.py): tests/site/sitecustomize.py then skips DeepSpeed's CPU shm
#: op build; the tests of that build itself remove it from their processes' environment
NO_SHM_OP = "ZEROPILOT_TESTS_NO_SHM_OP"


def extensions_dir(path: Path) -> str:
    """A ``TORCH_EXTENSIONS_DIR`` of the test's own at ``path``: a lock one test leaves cannot hang another."""
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


def pythonpath(*first: Path) -> str:
    """A child's PYTHONPATH: ``first``, then the suite's site folder."""
    return os.pathsep.join([str(p) for p in first if str(p) != str(SITE)] + [str(SITE)])


def run_group(cmd: Sequence[str], timeout: float = 120, env: Optional[Dict[str, str]] = None,
              cwd: Optional[Path] = None) -> subprocess.CompletedProcess:
    """``cmd`` in its own session (text stdout/stderr); a timeout kills its whole process group and raises."""
    proc = subprocess.Popen(list(cmd), cwd=str(cwd or REPO), env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_zeropilot(args: Sequence[str], timeout: float = 120,
                  env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    """``python -m zeropilot ARGS`` from the checkout, through :func:`run_group`."""
    child_env = dict(os.environ, PYTHONPATH=pythonpath(REPO / "src"), **(env or {}))
    return run_group([sys.executable, "-m", "zeropilot", *args], timeout, child_env)

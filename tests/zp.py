"""Run a command (``python -m zeropilot ARGS`` among them) in its own session, killed with its children on every path."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]


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
    child_env = dict(os.environ, PYTHONPATH=str(REPO / "src"), **(env or {}))
    return run_group([sys.executable, "-m", "zeropilot", *args], timeout, child_env)

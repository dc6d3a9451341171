"""Run ``python -m zeropilot ARGS`` from the checkout, in its own session, killed with its children on every path."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]


def run_zeropilot(args: Sequence[str], timeout: float = 120,
                  env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    """The finished command (text stdout/stderr); a timeout kills its whole process group and raises."""
    child_env = dict(os.environ, PYTHONPATH=str(REPO / "src"), **(env or {}))
    proc = subprocess.Popen([sys.executable, "-m", "zeropilot", *args], cwd=str(REPO), env=child_env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

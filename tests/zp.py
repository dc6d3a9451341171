"""Run a command (``python -m zeropilot ARGS`` among them) in its own session, killed with its children on every path."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Dict, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
#: the suite's ``sitecustomize`` (it keeps MLflow out of DeepSpeed's import): on every child's PYTHONPATH
SITE = REPO / "tests" / "site"
_BUILD_LOCK = threading.Lock()
SHM_OP = "deepspeed_shm_comm"


@functools.lru_cache(maxsize=None)
def _built_shm_op() -> Optional[Path]:
    """DeepSpeed's CPU shared-memory op (``deepspeed_shm_comm``, which ``init_distributed`` builds on the CPU
    accelerator: a minute or more of gcc on two cores), built once per test session into a folder of its own.
    None where it could not be built (each process then builds its own, as before)."""
    root = Path(tempfile.mkdtemp(prefix="zeropilot-shm-op-"))
    atexit.register(shutil.rmtree, root, True)
    env = dict(os.environ, DS_ACCELERATOR="cpu", TORCH_EXTENSIONS_DIR=str(root))
    try:
        done = run_group([sys.executable, "-c", "from deepspeed.comm.torch import build_shm_op; build_shm_op()"],
                         timeout=900, env=env)
    except subprocess.TimeoutExpired:
        return None
    built = root / SHM_OP
    return built if done.returncode == 0 and any(built.glob("*.so")) and not (built / "lock").exists() else None


def extensions_dir(path: Path) -> str:
    """A ``TORCH_EXTENSIONS_DIR`` of the test's own at ``path``, holding a copy of the session's built
    ``deepspeed_shm_comm`` (ninja finds it up to date: loading takes 0.1 s instead of a build). Each test keeps its
    own folder, so a lock one leaves cannot hang another."""
    with _BUILD_LOCK:
        built = _built_shm_op()
    path.mkdir(parents=True, exist_ok=True)
    if built is not None and not (path / SHM_OP).exists():
        shutil.copytree(built, path / SHM_OP)
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

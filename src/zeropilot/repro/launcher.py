"""Start one process group (one process per rank) for a repro leg, and make sure it ends.

Each rank is ``python -m zeropilot.repro.worker JOB`` with the torchrun environment (RANK, LOCAL_RANK,
WORLD_SIZE, MASTER_ADDR/PORT on a free port), in its own session so the whole tree can be killed. When one rank
exits with an error (an OOM leaves the others waiting in a collective) the others get a short grace period and are
then killed; a leg that outlives its timeout is killed too. No torch here.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

GRACE_S = 20.0


@dataclass
class LegRun:
    """How a leg's processes ended: exit codes per rank, whether it was killed, and why."""

    codes: List[Optional[int]]
    killed: Optional[str]
    seconds: float
    logs: List[Path]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _env(rank: int, world: int, port: int, cpu: bool, root: Path) -> Dict[str, str]:
    env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TOKENIZERS_PARALLELISM="false",
               PYTHONUNBUFFERED="1", CUBLAS_WORKSPACE_CONFIG=":4096:8")
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("TORCH_EXTENSIONS_DIR", str(root / ".torch_extensions"))
    if cpu:
        env.update(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    else:
        env.setdefault("NCCL_NVLS_ENABLE", "0")
    return env


def _kill(procs: List[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def run_leg(job: Dict, world: int, root: Path, timeout: float, cpu: bool) -> LegRun:
    """Run ``job`` on ``world`` ranks; logs in ``root/leg{N}-rank-{R}.log``."""
    leg = int(job["leg"])
    root.mkdir(parents=True, exist_ok=True)
    job_path = root / f"job-leg{leg}.json"
    job_path.write_text(json.dumps(job, indent=1))
    port = free_port()
    procs: List[subprocess.Popen] = []
    logs = [root / f"leg{leg}-rank-{r}.log" for r in range(world)]
    t0 = time.monotonic()
    killed: Optional[str] = None
    try:
        for rank in range(world):
            with open(logs[rank], "wb") as log:
                procs.append(subprocess.Popen([sys.executable, "-m", "zeropilot.repro.worker", str(job_path)],
                                              env=_env(rank, world, port, cpu, root), stdout=log,
                                              stderr=subprocess.STDOUT, start_new_session=True))
        failed_at: Optional[float] = None
        while any(p.poll() is None for p in procs):
            now = time.monotonic()
            if now - t0 > timeout:
                killed = f"leg {leg} ran past {timeout:.0f} s"
                break
            if failed_at is None and any(p.poll() not in (None, 0) for p in procs):
                failed_at = now
            if failed_at is not None and now - failed_at > GRACE_S:
                killed = f"a rank of leg {leg} failed; the others were stopped {GRACE_S:.0f} s later"
                break
            time.sleep(0.1)
    finally:
        _kill(procs)
    return LegRun([p.returncode for p in procs], killed, time.monotonic() - t0, logs)

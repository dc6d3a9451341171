"""Run repro cases: leg 1 (uninterrupted, saving) for every case in one process group, then leg 2 (resume) in a
new one, then the verdicts. Between the legs, a case resuming through a universal checkpoint has its save converted
by ``zeropilot ckpt universal`` (in this process: the conversion needs no torch). Writes each case's run directory:
``run.json`` (as ``zeropilot run`` would), ``rank-N.jsonl``, ``repro.json`` (the verdict), ``repro-spec.json``.
No torch here.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from zeropilot.errors import InputError
from zeropilot.repro import verdict
from zeropilot.repro.launcher import run_leg
from zeropilot.repro.spec import UNIVERSAL_DIR, ReproSpec
from zeropilot.runlog.layout import RUN_SCHEMA, write_json_atomic
from zeropilot.safefile import check_output

Case = Tuple[ReproSpec, Path]


def _versions() -> Dict[str, Optional[str]]:
    from importlib import metadata

    out: Dict[str, Optional[str]] = {}
    for name in ("torch", "deepspeed", "transformers", "peft", "accelerate"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _environment() -> Dict[str, str]:
    keys = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "CUDA_VISIBLE_DEVICES",
            "DS_ACCELERATOR")
    return {k: v for k, v in os.environ.items() if k in keys or k.startswith(("NCCL_", "TORCH_NCCL_"))}


def _job(leg: int, cases: Sequence[Case]) -> Dict[str, Any]:
    return {"leg": leg, "cases": [{"spec": spec.to_json(), "dir": str(root)} for spec, root in cases]}


def _groups(cases: Sequence[Case], key) -> Dict[Any, List[Case]]:
    groups: Dict[Any, List[Case]] = {}
    for case in cases:
        groups.setdefault(key(case[0]), []).append(case)
    return groups


def _run_leg(leg: int, cases: Sequence[Case], world_of, timeout: float, legs: Dict[str, Dict[int, Any]]) -> None:
    """Run one leg of ``cases``, one process group per (world size, device); record how each ended in ``legs``."""
    for (world, device), group in _groups(cases, lambda s: (world_of(s), s.device)).items():
        run = run_leg(_job(leg, group), world, group[0][1], timeout, device == "cpu")
        for _, root in group:
            legs[str(root)][leg] = asdict(run)


def run_cases(cases: Sequence[Case], timeout: float = 900.0, command: Optional[List[str]] = None,
              check: Optional[Dict[str, Any]] = None, keep_checkpoints: bool = True) -> List[Dict[str, Any]]:
    """Run every case (leg 1 grouped by world size, then leg 2 grouped by resume world size); their verdicts.

    Cases that share a world size share one process group per leg; every case has its own run directory.
    """
    started = time.time()
    for _, root in cases:
        clear_run_dir(root)
    for spec, root in cases:
        root.mkdir(parents=True, exist_ok=True)
        write_json_atomic(root / "repro-spec.json", spec.to_json())
        write_json_atomic(root / "run.json", _run_json(spec, command, check, started, None))
    legs: Dict[str, Dict[int, Any]] = {str(root): {} for _, root in cases}
    _run_leg(1, cases, lambda s: s.nproc, timeout, legs)
    conversions = {str(root): convert_for_resume(spec, root) for spec, root in cases
                   if spec.universal and spec.resume_from is not None}
    resumed = [c for c in cases if c[0].resume_from is not None and not conversions.get(str(c[1]), {}).get("error")]
    _run_leg(2, resumed, lambda s: s.resume_nproc, timeout, legs)
    verdicts = []
    for spec, root in cases:
        v = verdict.build(spec, root, {k: _jsonable(x) for k, x in legs[str(root)].items()},
                          conversions.get(str(root)))
        write_json_atomic(root / "repro.json", v)
        write_json_atomic(root / "run.json", _run_json(spec, command, check, started, legs[str(root)]))
        if not keep_checkpoints:
            for old in ("checkpoints", "checkpoints-leg2", UNIVERSAL_DIR):
                shutil.rmtree(root / old, ignore_errors=True)
        verdicts.append(v)
    return verdicts


def convert_for_resume(spec: ReproSpec, root: Path) -> Dict[str, Any]:
    """Convert leg 1's save at ``resume_from`` with ``zeropilot ckpt universal`` into ``root/checkpoints-universal``.

    Returns what was written (``seconds``, ``files``, ``tensor_bytes``, ``states``) or ``{"error": why}``.
    """
    from zeropilot.checkpoint.reconstruct import DamagedCheckpoint
    from zeropilot.checkpoint.universal import UniversalOptions, convert

    t = time.perf_counter()
    try:
        result = convert(root / "checkpoints", root / UNIVERSAL_DIR,
                         UniversalOptions(tag=f"global_step{spec.resume_from}", force=True, progress=False))
    except (InputError, DamagedCheckpoint) as exc:
        return {"error": f"zeropilot ckpt universal: {exc}"}
    return {"seconds": time.perf_counter() - t, "out": str(result.out), "tag": result.tag, "files": result.files,
            "tensor_bytes": result.bytes, "parameters": result.parameters, "states": result.states}


#: What a repro writes into its run directory; only these are removed when a run directory is reused.
_OURS = ("run.json", "repro.json", "repro-spec.json", "job-leg*.json", "leg*-rank-*.json", "leg*-rank-*.log",
         "rank-*.jsonl", "oom-rank-*.json")


def clear_run_dir(root: Path) -> None:
    """Make ``root`` ready: new, empty, or an earlier repro's (its files removed, nothing else touched).

    Raises:
        InputError: ``root`` is a file, or a folder with files that are not a repro's.
    """
    check_output(root, "dir")  # a file, FIFO or device there: never used as the run directory
    if not root.exists():
        return
    if not any(root.iterdir()):
        return
    if not (root / "repro-spec.json").is_file():
        raise InputError("--out folder is not empty and holds no earlier repro (no repro-spec.json): give a new or "
                         "empty folder", path=root)
    for pattern in _OURS:
        for f in root.glob(pattern):
            f.unlink()
    for folder in ("checkpoints", "checkpoints-leg2", UNIVERSAL_DIR, "state", ".torch_extensions"):
        shutil.rmtree(root / folder, ignore_errors=True)


def _jsonable(leg: Dict[str, Any]) -> Dict[str, Any]:
    return {**leg, "logs": [str(p) for p in leg.get("logs", [])]}


def _run_json(spec: ReproSpec, command: Optional[List[str]], check: Optional[Dict[str, Any]], started: float,
              legs: Optional[Dict[int, Any]]) -> Dict[str, Any]:
    """``run.json`` as the run-directory contract has it; ``exit_code`` 0 when every rank of every leg ended 0."""
    out: Dict[str, Any] = {"schema": RUN_SCHEMA, "command": command or [sys.executable, "-m", "zeropilot", "repro"],
                           "cwd": os.getcwd(), "started_at": started, "world_size": spec.nproc,
                           "versions": _versions(), "environment": _environment(), "check": check, "plan": None,
                           "hang_timeout_s": None, "on_hang": None, "repro": True}
    if legs is not None:
        codes = [c for leg in legs.values() for c in leg["codes"]]
        killed = [leg["killed"] for leg in legs.values() if leg.get("killed")]
        out.update(ended_at=time.time(), exit_code=next((c for c in codes if c not in (0, None)), 0 if codes else None),
                   signal="SIGKILL" if killed else None)
    return out

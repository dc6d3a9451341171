"""This machine's state that can stop a launch before its first step: stale op-build locks. No torch import.

PyTorch builds JIT C++/CUDA extensions (DeepSpeed's ops: the CPU shm all-reduce, fused Adam, ...) under
``$TORCH_EXTENSIONS_DIR/<op>/`` or, when that is unset, ``$XDG_CACHE_HOME/torch_extensions/<pyXY_acc>/<op>/``
(``~/.cache`` by default). The build holds ``<op>/lock``, created with ``O_EXCL`` by
``torch.utils.file_baton.FileBaton``; a process killed mid-build leaves the file behind, and every later build of
that op waits for it to disappear — forever, silently (``torch/utils/cpp_extension.py`` passes no
``warn_after_seconds``). :func:`find_build_locks` lists such locks; ``zeropilot check`` (rule MC001) and the
runtime guard both use it, so it stays small and free of torch.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Mapping, Optional

# A build of DeepSpeed's biggest CPU op takes about a minute on 2 cores; a lock older than this is almost surely
# left by a killed process (a running build rewrites nothing in the lock, so age is since the build started).
STALE_AFTER_S = 15 * 60
_MAX_ENTRIES = 2000  # bound on the directory entries read (a cache with thousands of ops is not a launch's)


@dataclass(frozen=True)
class BuildLock:
    """A ``lock`` file in an op's build directory.

    Attributes:
        path: the lock file.
        op: the op's name (its build directory's name).
        age_s: seconds since the lock was created (modified), at the time it was found.
        stale: older than :data:`STALE_AFTER_S` (a build that old is not running any more).
    """

    path: Path
    op: str
    age_s: float
    stale: bool


def extensions_roots(env: Mapping[str, str]) -> List[Path]:
    """Where torch builds extensions for this environment: ``TORCH_EXTENSIONS_DIR`` if set, else the cache folder
    (its per-Python/accelerator subfolders are searched by :func:`find_build_locks`)."""
    explicit = env.get("TORCH_EXTENSIONS_DIR")
    if explicit:
        return [Path(explicit).expanduser()]
    cache = env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".cache")
    return [Path(cache).expanduser() / "torch_extensions"]


def _candidates(root: Path) -> Iterator[Path]:
    """``root/<op>/lock`` and ``root/<pyXY_acc>/<op>/lock``, reading at most ``_MAX_ENTRIES`` entries."""
    seen = 0
    try:
        level1 = list(os.scandir(root))[:_MAX_ENTRIES]
    except OSError:
        return
    for entry in level1:
        seen += 1
        if not entry.is_dir(follow_symlinks=False):
            continue
        yield Path(entry.path) / "lock"
        try:
            with os.scandir(entry.path) as inner:
                for sub in inner:
                    seen += 1
                    if seen > _MAX_ENTRIES:
                        return
                    if sub.is_dir(follow_symlinks=False):
                        yield Path(sub.path) / "lock"
        except OSError:
            continue


def find_build_locks(roots: List[Path], now: Optional[float] = None) -> List[BuildLock]:
    """Every op-build lock under ``roots`` (see :func:`extensions_roots`), oldest first."""
    now = time.time() if now is None else now
    out = []
    for root in roots:
        for lock in _candidates(root):
            try:
                mtime = lock.stat().st_mtime
            except OSError:
                continue
            age = max(0.0, now - mtime)
            out.append(BuildLock(lock, lock.parent.name, age, age >= STALE_AFTER_S))
    return sorted(out, key=lambda b: -b.age_s)


@dataclass(frozen=True)
class MachineState:
    """What was read about this machine for a check: the extension roots searched and the locks found."""

    roots: List[Path]
    locks: List[BuildLock]


def inspect_machine(env: Mapping[str, str]) -> MachineState:
    """Read this machine's op-build locks for the environment the launch runs with."""
    roots = extensions_roots(env)
    return MachineState(roots, find_build_locks(roots))

"""Op-build locks: which ones this job took, which are live or stale, and removing the ones it left (torch-free).

PyTorch's C++ extension builder (used by DeepSpeed's op builder) takes ``<extensions dir>/<op>/lock`` with
``O_EXCL`` and every other process polls until it disappears (``torch.utils.file_baton``). A build killed half-way
leaves the file and every later launch waits forever, silently. Where the locks are and how old they are is
:mod:`zeropilot.launch.machine`'s (also behind rule MC001).

In the job: every process's ``FileBaton.try_acquire`` / ``release`` is wrapped (:func:`patch_file_baton`), and each
lock a process of the job takes or gives back is appended to ``build-locks.jsonl`` in the run directory
(:func:`note`). After the job: :func:`remove_left` deletes the locks the job took and did not give back (its
build was stopped), and only those: the same file (device and inode) as taken, under the job's extension
folders, its taker gone. A lock that was there before, or that another process holds, is never touched.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional

from zeropilot.launch.machine import extensions_roots, find_build_locks
from zeropilot.runlog.layout import RunDir

RUN_DIR_ENV = "ZEROPILOT_RUN_DIR"
MAX_FILE = 1 << 20  # build-locks.jsonl read at most this far: a job takes a handful of locks


def note(action: str, path: Any) -> None:
    """Append ``{t, pid, rank, action, path, dev, ino}`` to the run's ``build-locks.jsonl`` (no-op outside a run)."""
    root = os.environ.get(RUN_DIR_ENV)
    if not root or path is None:
        return
    p = os.path.abspath(os.fspath(path))
    rec: Dict[str, Any] = {"t": time.time(), "pid": os.getpid(), "rank": os.environ.get("RANK"), "action": action,
                           "path": p}
    try:
        st = os.stat(p)
        rec.update(dev=st.st_dev, ino=st.st_ino)
    except OSError:
        pass
    try:
        fd = os.open(str(RunDir(Path(root)).build_locks), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, (json.dumps(rec) + "\n").encode("utf-8"))
        finally:
            os.close(fd)
    except OSError:
        pass


def patch_file_baton(module: Any) -> None:
    """Wrap ``FileBaton.try_acquire`` (a lock taken) and ``release`` (given back), once."""
    from zeropilot.guard.checkpoint import wrap_method

    def acquire(original: Callable) -> Callable:
        def wrapper(self, *args, **kwargs):
            got = original(self, *args, **kwargs)
            if got:
                note("acquired", getattr(self, "lock_file_path", None))
            return got
        return wrapper

    def release(original: Callable) -> Callable:
        def wrapper(self, *args, **kwargs):
            note("released", getattr(self, "lock_file_path", None))
            return original(self, *args, **kwargs)
        return wrapper

    cls = getattr(module, "FileBaton", None)
    if cls is not None:
        wrap_method(cls, "try_acquire", acquire)
        wrap_method(cls, "release", release)


def taken(run_dir: Path) -> Dict[str, Dict[str, Any]]:
    """Locks a process of this job took and did not give back: path -> its ``acquired`` record."""
    path = RunDir(Path(run_dir)).build_locks
    held: Dict[str, Dict[str, Any]] = {}
    try:
        with open(path, "rb") as fh:
            lines = fh.read(MAX_FILE).decode("utf-8", "replace").splitlines()
    except OSError:
        return held
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not isinstance(rec, dict) or not isinstance(rec.get("path"), str):
            continue
        if rec.get("action") == "acquired":
            held[rec["path"]] = rec
        elif rec.get("action") == "released":
            held.pop(rec["path"], None)
    return held


def _under(path: Path, roots: List[Path]) -> bool:
    try:
        real = path.resolve()
        return path.name == "lock" and any(real.is_relative_to(r.resolve()) for r in roots)
    except (OSError, ValueError):
        return False


def remove_left(run_dir: Path, env: Mapping[str, str], alive: Callable[[Any], Optional[bool]]) -> List[Dict[str, Any]]:
    """Delete the op-build locks this job took and left (its build was stopped); ``{path, op, age_s, pid}`` each.

    A lock is removed only when: a process of this job recorded taking it and no release followed; it is the same
    file (device, inode); it lies under the job's extension folders and is named ``lock``; its taker is gone.
    """
    roots = extensions_roots(env)
    removed = []
    for p, rec in taken(run_dir).items():
        path = Path(p)
        if not _under(path, roots) or alive(rec.get("pid")):
            continue
        try:
            st = os.stat(path)
            if (rec.get("dev"), rec.get("ino")) != (st.st_dev, st.st_ino):
                continue
            age = round(max(0.0, time.time() - st.st_mtime), 1)
            os.unlink(path)
        except OSError:
            continue
        removed.append({"path": str(path), "op": path.parent.name, "age_s": age, "pid": rec.get("pid")})
    return removed


def find_locks(env: Optional[Mapping[str, str]] = None, run_dir: Optional[Path] = None,
               live_dirs: Optional[List[str]] = None,
               alive: Optional[Callable[[Any], Optional[bool]]] = None) -> List[Dict[str, object]]:
    """Every op-build lock of the launch's environment, oldest first: path, op, age, state, ours.

    ``state``: ``live`` when a compiler of this job works in the lock's folder (``live_dirs``) or a live process of
    this job holds it, else ``stale``; ``ours``: a process of this job took it (``run_dir``'s ``build-locks.jsonl``);
    ``holder_pid`` / ``holder_rank``: who of this job took it (None: not this job).
    """
    roots = extensions_roots(os.environ if env is None else env)
    held = taken(run_dir) if run_dir is not None else {}
    dirs = [os.path.realpath(d) for d in live_dirs or []]
    out = []
    for b in find_build_locks(roots):
        folder = os.path.realpath(str(b.path.parent))
        building = any(d == folder or d.startswith(folder + os.sep) for d in dirs)
        holder = held.get(str(b.path))
        building = building or bool(holder and alive is not None and alive(holder.get("pid")))
        out.append({"path": str(b.path), "op": b.op, "age_s": round(b.age_s, 1), "stale": b.stale,
                    "state": "live" if building else "stale", "ours": str(b.path) in held,
                    "holder_pid": (holder or {}).get("pid"), "holder_rank": (holder or {}).get("rank")})
    return out
